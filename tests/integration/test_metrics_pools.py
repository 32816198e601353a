"""Worker metrics and the pool: what a prefork worker's endpoint cannot see, it says."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Harness
from workers.local.redis_server import free_port

pytestmark = pytest.mark.integration


def test_a_prefork_worker_serving_metrics_warns_they_miss_its_turns(harness: Harness) -> None:
    """Turns run, and count themselves, in a prefork worker's children, which its metrics
    endpoint (the parent's) does not see: the worker says so at start (its dashboard showed an
    idle fleet). A threads worker, whose turns its endpoint counts, says nothing of it."""
    harness.configure(SOULFLEET_METRICS_PORT=str(free_port()))
    prefork = harness.worker("w1", pool="prefork", concurrency=1)
    warned = prefork.wait_for_event("metrics.prefork_blind", timeout=60)
    assert "child processes" in warned["problem"]
    assert "threads pool" in warned["hint"]
    harness.configure(SOULFLEET_METRICS_PORT=str(free_port()))
    threads = harness.worker("w2", pool="threads", concurrency=2)
    assert threads.events("worker.ready")
    assert threads.events("metrics.prefork_blind") == []

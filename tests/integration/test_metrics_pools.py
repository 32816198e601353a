"""Worker metrics and the pool: a prefork worker's endpoint sums what its children count."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from tests.support.memory import remember_then_answer
from workers.local.redis_server import free_port
from workers.metric_files import ENV

pytestmark = pytest.mark.integration


_COUNT_FIVE = (  # another program's counts, in the directory it was given
    "from prometheus_client import Counter\n"
    "turns = Counter('soulfleet_turns', 'turns', ['kind', 'status'])\n"
    "turns.labels(kind='interactive', status='done').inc(5)\n"
)


def _sample(port: int, series: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _turns_done(port: int) -> float:
    return _sample(port, 'soulfleet_turns_total{kind="interactive",status="done"}')


def test_a_prefork_workers_endpoint_counts_the_turns_its_children_run(harness: Harness) -> None:
    """Turns run, and count themselves, in a prefork worker's children: their counts reach
    the parent's endpoint through metric files in a directory of the worker's own (its
    dashboard showed an idle fleet), removed when the worker stops; no warning says it is
    blind."""
    names = ("ava", "bea", "cid")
    for name in names:
        harness.persona(name, rules=remember_then_answer(0))
    # A directory in the environment (`up` passes its own to every process) holding another
    # process's counts: the worker uses a directory of its own, or it would count those too.
    stale = harness.root.parent / "shared-metrics"
    stale.mkdir()
    subprocess.run(
        [sys.executable, "-c", _COUNT_FIVE], env={**os.environ, ENV: str(stale)}, check=True
    )
    assert any(stale.iterdir())
    port = free_port()
    harness.configure(SOULFLEET_METRICS_PORT=str(port), **{ENV: str(stale)})
    prefork = harness.worker("w1", pool="prefork", concurrency=2)
    ready = prefork.wait_for_event("worker.ready", timeout=60)
    for name in names:  # one turn each, run by whichever child takes it
        harness.fleet.post(name, "hello")
    wait_until(lambda: _turns_done(port) >= 3.0, timeout=60, what="3 turns counted")
    assert _turns_done(port) == 3.0
    # counted by the observers the pool's first children inherit (set before they fork)
    assert _sample(port, 'soulfleet_tool_calls_total{outcome="ok",source="builtin"}') == 3.0
    assert _sample(port, "soulfleet_memory_lock_wait_seconds_count") == 3.0
    assert prefork.events("metrics.prefork_blind") == []
    assert ready["pool"] == "prefork"
    files = ready["metric_files"]
    assert files != str(stale)
    assert any(name.endswith(".db") for name in os.listdir(files))
    prefork.stop()
    assert not os.path.exists(files)


def test_a_threads_workers_endpoint_counts_its_turns(harness: Harness) -> None:
    """A threads worker counts in its one process, with no metric files and no warning."""
    harness.persona("ava", rules='[[rules]]\ntext = "ok"\n')
    port = free_port()
    harness.configure(SOULFLEET_METRICS_PORT=str(port))
    threads = harness.worker("w1", pool="threads", concurrency=2)
    assert "metric_files" not in threads.wait_for_event("worker.ready", timeout=60)
    harness.fleet.post("ava", "hello")
    wait_until(lambda: _turns_done(port) >= 1.0, timeout=60, what="the turn counted")
    assert threads.events("metrics.prefork_blind") == []

"""Raw-published turn messages (workers/turn_messages.py) on a real Celery worker: each turn
runs once, on its lane, with its kind, and is acked."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from workers.publisher import CeleryPublisher
from workers.queues import queue_name
from workers.turn_messages import raw_publishing

pytestmark = pytest.mark.integration

HEARTBEAT_OK = """
[[rules]]
text = "HEARTBEAT_OK"
"""


def test_a_real_worker_runs_each_raw_published_turn_once_and_acks_it(harness: Harness) -> None:
    """Ticks through the host's CeleryPublisher (the raw path) reach a real worker: every
    heartbeat and dream turn starts once on its lane with its kind, and afterwards no message
    is left on a queue or unacked."""
    for n in range(20):
        harness.persona(f"p{n:02d}", rules=HEARTBEAT_OK, toml='[dream]\nevery = "24h"\n')
    publisher = harness.fleet.publisher
    assert isinstance(publisher, CeleryPublisher)
    assert raw_publishing(publisher.app)
    harness.worker(concurrency=4)
    pairs = [(f"p{n:02d}", "heartbeat") for n in range(20)]
    pairs += [(f"p{n:02d}-dreamer", "dream") for n in range(20)]
    outcomes = harness.fleet.tick_lanes(pairs)
    assert Counter(o.outcome for o in outcomes) == {"queued": 40}

    wait_until(lambda: len(harness.events("turn.end")) >= 40, timeout=90, what="40 turns")
    ends = harness.events("turn.end")
    assert sorted((e["lane"], e["kind"]) for e in ends) == sorted(pairs)
    assert {e["turn_id"] for e in ends} == {o.turn_id for o in outcomes}
    client = harness.fleet.client
    prefix = f"{harness.settings.key_prefix}broker:"
    for kind in ("heartbeat", "dream"):
        assert client.llen(prefix + queue_name(harness.settings.queue_prefix, kind)) == 0
    wait_until(lambda: client.hlen(f"{prefix}unacked") == 0, timeout=30, what="acks")

"""workers/queues.py: one queue per turn kind, one task name for every persona."""

from __future__ import annotations

import pytest

from workers.queues import KINDS, TURN_TASK, declare_queues, queue_name


def test_three_queues_by_kind_bound_by_their_own_names() -> None:
    """interactive, heartbeat and dream each get a durable queue on one direct exchange."""
    queues = declare_queues("fleet")
    assert [q.name for q in queues] == ["fleet.interactive", "fleet.heartbeat", "fleet.dream"]
    assert all(q.routing_key == q.name and q.durable for q in queues)
    assert {q.exchange.name for q in queues} == {"fleet"}
    assert KINDS == ("interactive", "heartbeat", "dream")
    assert TURN_TASK == "soulfleet.turn"


def test_an_unknown_kind_is_refused() -> None:
    """A typo never invents a queue no worker serves."""
    with pytest.raises(ValueError, match="unknown turn kind"):
        queue_name("fleet", "dreams")

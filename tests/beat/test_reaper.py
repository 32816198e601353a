"""beat/reaper.py: stranded lanes are re-queued, re-published and reported."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from beat.reaper import Reaper
from beat.sweep import Sweeper
from tests.beat.conftest import Events
from tests.beat.test_sweep import sync
from tests.support.beat import RecordingPublisher, write_persona
from workers.fleet import Fleet
from workers.fleet.errors import RedisUnavailable
from workers.persona.clock import VirtualClock


def repairs_counted(reason: str) -> float:
    return REGISTRY.get_sample_value("soulfleet_reaper_repairs_total", {"reason": reason}) or 0.0


def test_a_lane_whose_queued_message_was_lost_is_republished(
    fleet: Fleet, clock: VirtualClock, publisher: RecordingPublisher, events: Events
) -> None:
    """A queued turn whose message never reached a worker is re-published after the threshold."""
    [queued] = fleet.tick_lanes([("ava", "heartbeat")])
    assert queued.turn_id is not None
    publisher.sent.clear()  # the broker lost the message: no worker will ever start this turn
    reaper = Reaper(fleet)
    assert reaper.run().repairs == []  # not stranded yet: queued moments ago
    before = repairs_counted("queued_too_long")
    clock.advance(fleet.settings.reap_queued_after + 1)
    report = reaper.run()
    assert [(r.lane, r.reason, r.turn_id) for r in report.repairs] == [
        ("ava", "queued_too_long", queued.turn_id)
    ]
    assert publisher.sent == [("ava", queued.turn_id, "heartbeat")]
    [logged] = events.named("reaper.repaired")
    assert (logged["lane"], logged["reason"], logged["turn_id"]) == (
        "ava",
        "queued_too_long",
        queued.turn_id,
    )
    done = events.named("reaper.done")[-1]
    assert (done["repaired"], done["queued_too_long"], done["lease_expired"]) == (1, 1, 0)
    assert repairs_counted("queued_too_long") == before + 1  # counted once, not twice
    assert reaper.run().repairs == []  # re-published just now: not stranded again yet


def test_a_lane_whose_worker_died_mid_turn_is_requeued(
    fleet: Fleet, clock: VirtualClock, publisher: RecordingPublisher, redis_client: redis.Redis
) -> None:
    """A running lane whose lease expired gets a new turn id, published for another worker."""
    [queued] = fleet.tick_lanes([("ava", "heartbeat")])
    assert queued.turn_id is not None
    started = fleet.lanes.start("ava", queued.turn_id, "dead-worker")
    assert started.status == "started"
    publisher.sent.clear()
    # Nobody renews: the worker is gone. The lanes:running score runs on the virtual clock;
    # Redis expires the lease key on its real one, so do now what its TTL would do then.
    clock.advance(fleet.settings.lease_ttl + 1)
    assert redis_client.delete(fleet.keys.lease("ava")) == 1
    report = Reaper(fleet).run()
    [repair] = report.repairs
    assert (repair.lane, repair.reason, repair.kind) == ("ava", "lease_expired", "heartbeat")
    assert repair.turn_id != queued.turn_id
    assert publisher.sent == [("ava", repair.turn_id, "heartbeat")]
    assert fleet.lanes.status("ava")["state"] == "queued"


def test_the_reap_of_a_probing_lane_frees_its_providers_probe(
    fleet: Fleet, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """The breaker's probe ran on a lane whose worker died: reaping that lane frees the probe
    slot, so the provider's deferred lanes are probed for again within a probe interval (they
    waited out the whole probe ttl, 20 minutes at the defaults, the provider long well)."""
    breaker = fleet.breaker
    for _ in range(breaker.min_calls):
        breaker.record("openai", ok=False, error="500")
    clock.advance(breaker.probe_interval + 1)
    [queued] = fleet.tick_lanes([("ava", "heartbeat")])
    assert queued.turn_id is not None
    fleet.lanes.start("ava", queued.turn_id, "dead-worker")
    assert breaker.allow("openai", "ava") == "probe"
    assert breaker.look("openai") == "paused"
    clock.advance(fleet.settings.lease_ttl + 1)
    assert redis_client.delete(fleet.keys.lease("ava")) == 1
    [repair] = Reaper(fleet).run().repairs
    assert repair.reason == "lease_expired"
    assert breaker.look("openai") == "probe_due"


def test_a_healthy_fleet_needs_no_repairs(
    fleet: Fleet, clock: VirtualClock, publisher: RecordingPublisher, events: Events
) -> None:
    """Running lanes with live leases and fresh queued lanes are left alone."""
    [running] = fleet.tick_lanes([("ava", "heartbeat")])
    fleet.tick_lanes([("bob", "heartbeat")])
    assert running.turn_id is not None
    started = fleet.lanes.start("ava", running.turn_id, "w1")
    clock.advance(fleet.settings.lease_ttl / 2)
    assert fleet.lanes.renew("ava", started.fence)
    sent = list(publisher.sent)
    assert Reaper(fleet).run().repairs == []
    assert publisher.sent == sent
    [done] = events.named("reaper.done")
    assert done["repaired"] == 0


class _RefusingBroker(RecordingPublisher):
    """A broker that refuses every wake-up until ``refuse`` is cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = True

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        if self.refuse and turns:
            raise RedisUnavailable("redis://broker:6379/1", "Connection refused")
        super().publish_many(turns)


def test_a_post_whose_wake_up_is_refused_is_kept_and_sent_by_the_next_reaper_pass(
    fleet: Fleet, persona_root: Path, events: Events
) -> None:
    """The broker refuses the wake-up of a post that queued a turn: the item is in the inbox,
    so the post returns (saying the wake-up was not sent) instead of raising, which told the
    sender to post again (a duplicate). The lane goes to the reaper's NEXT pass, not its
    600 s wait for a message that may be slow, and that pass sends the same turn."""
    write_persona(persona_root, "ava")
    broker = _RefusingBroker()
    fleet.publisher = broker
    outcome = fleet.post("ava", "hello", wake=True)
    assert outcome.outcome == "queued"
    assert outcome.unsent is not None
    assert "Connection refused" in outcome.unsent
    assert outcome.resend_soon
    assert fleet.status("ava")["inbox_depth"] == 1
    broker.refuse = False
    assert fleet.lane_counts()["stuck_queued"] == 0  # waiting for the next pass, not stuck
    report = Reaper(fleet).run()  # no clock advance: well inside SOULFLEET_REAP_QUEUED_AFTER
    assert [(r.lane, r.turn_id, r.reason) for r in report.repairs] == [
        ("ava", outcome.turn_id, "unsent")
    ]
    assert broker.sent == [("ava", outcome.turn_id, "interactive")]


def test_ticks_whose_wake_ups_are_refused_go_to_the_next_reaper_pass(fleet: Fleet) -> None:
    """Beat's publish of ticked turns fails (and raises, as before: beat logs it); the lanes
    are queued all the same, and the reaper's next pass sends them instead of waiting 600 s."""
    broker = _RefusingBroker()
    fleet.publisher = broker
    with pytest.raises(RedisUnavailable):
        fleet.tick_lanes([("ava", "heartbeat"), ("bob", "heartbeat")])
    broker.refuse = False
    report = Reaper(fleet).run()
    assert sorted(r.lane for r in report.repairs) == ["ava", "bob"]
    assert sorted(lane for lane, _, _ in broker.sent) == ["ava", "bob"]


def test_a_sweep_whose_wake_ups_are_refused_hands_them_to_the_next_reaper_pass(
    fleet: Fleet, persona_root: Path, clock: VirtualClock
) -> None:
    """Scheduled heartbeats ticked by beat's sweep, their publish refused: the lanes are
    queued all the same, and the reaper's next pass sends them (the sweep published around
    Fleet.send, so they waited 600 s)."""
    write_persona(persona_root, "ava", '[heartbeat]\nevery = "1m"\n')
    sync(fleet)
    broker = _RefusingBroker()
    fleet.publisher = broker
    clock.advance(61)
    with pytest.raises(RedisUnavailable):
        Sweeper(fleet).run()
    broker.refuse = False
    report = Reaper(fleet).run()
    assert [r.lane for r in report.repairs] == ["ava"]
    assert [lane for lane, _, _ in broker.sent] == ["ava"]

"""Receive claims on a real Redis: a turn message a worker took and never started is found by
its lapsed claim and re-published (the same turn id), while a message that merely waits in the
broker is never touched."""

from __future__ import annotations

import time

import pytest
import redis

from tests.support.lanes import item, make_breaker, make_lanes
from workers.fleet.lanes import Lanes
from workers.fleet.lease import ClaimHandle, Renewer
from workers.fleet.recovery import Recovery
from workers.persona.clock import VirtualClock


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=1_700_000_000.0)


@pytest.fixture
def lanes(redis_client: redis.Redis, key_prefix: str, clock: VirtualClock) -> Lanes:
    return make_lanes(redis_client, key_prefix, clock=clock)


@pytest.fixture
def recovery(lanes: Lanes, redis_client: redis.Redis, key_prefix: str) -> Recovery:
    breaker = make_breaker(redis_client, key_prefix, clock=lanes.clock)
    return Recovery(lanes, breaker, claim_ttl=6)


def _queued(lanes: Lanes, lane: str) -> str:
    turn_id = lanes.post(lane, item("hi"), wake=True).turn_id
    assert turn_id is not None
    return turn_id


def test_a_lapsed_claim_is_republished_with_the_same_turn_id(
    lanes: Lanes, recovery: Recovery, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """Claimed then the worker died (its claim key lapsed): one recovery pass re-publishes the
    lane's own turn, which a second worker starts; lanes whose message is still in the broker
    (never claimed) are left alone however long they wait."""
    lost = _queued(lanes, "lost")
    _queued(lanes, "waiting")
    assert lanes.receive("lost", lost, "w1", ttl=6)
    clock.advance(7)
    redis_client.delete(lanes.keys.claim("lost"))  # the PX TTL ran out: same state
    repairs = recovery.reap_claims()
    assert [(r.lane, r.reason, r.turn_id, r.kind) for r in repairs] == [
        ("lost", "claim_lapsed", lost, "interactive")
    ]
    assert redis_client.zcard(lanes.keys.claimed) == 0
    assert lanes.start("lost", lost, "w2").status == "started"
    clock.advance(3600)
    assert recovery.reap_claims() == []


def test_a_live_claim_and_a_started_turn_are_left_alone(
    lanes: Lanes, recovery: Recovery, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """A claim still renewed is alive; start deletes the claim and its index entry."""
    alive = _queued(lanes, "alive")
    started = _queued(lanes, "started")
    assert lanes.receive("alive", alive, "w1", ttl=60)
    assert lanes.receive("started", started, "w1", ttl=60)
    assert lanes.start("started", started, "w1").status == "started"
    assert redis_client.exists(lanes.keys.claim("started")) == 0
    clock.advance(30)
    assert recovery.reap_claims() == []
    assert redis_client.zrange(lanes.keys.claimed, 0, -1) == ["alive"]


def test_a_stale_or_duplicate_message_claims_nothing(lanes: Lanes) -> None:
    """Only the lane's current queued turn can be claimed."""
    turn_id = _queued(lanes, "ava")
    assert not lanes.receive("ava", "not-the-turn", "w1", ttl=6)
    assert lanes.start("ava", turn_id, "w1").status == "started"
    assert not lanes.receive("ava", turn_id, "w2", ttl=6)


def test_the_renewer_keeps_a_claim_alive_and_drops_it_quietly_once_gone(
    lanes: Lanes, redis_client: redis.Redis
) -> None:
    """Renewal extends the claim key; after start deleted it, the handle unregisters itself."""
    turn_id = _queued(lanes, "ava")
    assert lanes.receive("ava", turn_id, "w1", ttl=2)
    renewer = Renewer(ttl=30, interval=100)
    handle = ClaimHandle(lanes, "ava", turn_id, ttl=20)
    renewer.register(handle)
    try:
        renewer.renew_now()
        assert redis_client.pttl(lanes.keys.claim("ava")) > 10_000
        lanes.start("ava", turn_id, "w1")
        renewer.renew_now()
        assert handle.lost.is_set()
        assert len(renewer) == 0
    finally:
        renewer.stop()


def _running_with_a_follow_up(lanes: Lanes, lane: str) -> int:
    """A started turn on ``lane`` with another item posted while it runs; returns its fence."""
    started = lanes.start(lane, _queued(lanes, lane), "w1")
    assert started.status == "started"
    assert lanes.post(lane, item("while it ran"), wake=True).outcome == "pending"
    return started.fence


def test_a_follow_up_whose_publisher_died_is_republished_from_its_lapsed_claim(
    lanes: Lanes, recovery: Recovery, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """finish.lua queues a follow-up and claims the lane for the worker that will publish it.
    A worker killed after the commit and before the publish left the lane queued with its
    message nowhere (found by the ops trial: 600 s, until SOULFLEET_REAP_QUEUED_AFTER); now
    its claim lapses and one recovery pass re-publishes the follow-up's own turn id."""
    fence = _running_with_a_follow_up(lanes, "ava")
    finished = lanes.finish("ava", fence, status="done", text="ok", publisher="w1", claim_ttl=6)
    assert finished.follow_up_turn_id is not None
    assert redis_client.get(lanes.keys.claim("ava")) == f"w1|{finished.follow_up_turn_id}"
    assert recovery.reap_claims() == []  # alive: the publisher may still be at it
    clock.advance(7)
    redis_client.delete(lanes.keys.claim("ava"))  # the PX TTL ran out: same state
    repairs = recovery.reap_claims()
    assert [(r.lane, r.reason, r.turn_id) for r in repairs] == [
        ("ava", "claim_lapsed", finished.follow_up_turn_id)
    ]
    assert lanes.start("ava", finished.follow_up_turn_id, "w2").status == "started"


def test_a_published_follow_up_drops_only_its_own_claim(
    lanes: Lanes, recovery: Recovery, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """Once the follow-up is published its publisher drops the claim (unclaim.lua), so beat
    never re-publishes a message that waits in a backlog; a claim the receiving worker took
    meanwhile is that worker's and stays."""
    fence = _running_with_a_follow_up(lanes, "ava")
    follow = lanes.finish("ava", fence, status="done", text="", publisher="w1", claim_ttl=6)
    assert follow.follow_up_turn_id is not None
    assert lanes.unclaim("ava", follow.follow_up_turn_id, "w1")
    assert redis_client.exists(lanes.keys.claim("ava")) == 0
    assert redis_client.zcard(lanes.keys.claimed) == 0
    clock.advance(3600)
    assert recovery.reap_claims() == []

    fence = _running_with_a_follow_up(lanes, "bob")
    follow = lanes.finish("bob", fence, status="done", text="", publisher="w1", claim_ttl=6)
    assert follow.follow_up_turn_id is not None
    assert lanes.receive("bob", follow.follow_up_turn_id, "w2", ttl=6)  # w2 took it first
    assert not lanes.unclaim("bob", follow.follow_up_turn_id, "w1")
    assert redis_client.get(lanes.keys.claim("bob")) == f"w2|{follow.follow_up_turn_id}"


def test_a_commit_without_a_publisher_or_follow_up_claims_nothing(
    lanes: Lanes, redis_client: redis.Redis
) -> None:
    """No claim when nothing is queued, nor for a caller that names no publisher."""
    started = lanes.start("ava", _queued(lanes, "ava"), "w1")
    assert (
        lanes.finish(
            "ava", started.fence, status="done", text="", publisher="w1", claim_ttl=6
        ).follow_up_turn_id
        is None
    )
    fence = _running_with_a_follow_up(lanes, "bob")
    assert lanes.finish("bob", fence, status="done", text="").follow_up_turn_id is not None
    assert redis_client.zcard(lanes.keys.claimed) == 0


def test_a_retry_queued_at_once_is_claimed_for_its_publisher_like_a_follow_up(
    lanes: Lanes, recovery: Recovery, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """A failure whose backoff comes out 0 queues the retry at once (fail.lua): claimed for the
    worker that publishes it, so a worker killed before the publish is re-published from the
    lapsed claim, not after SOULFLEET_REAP_QUEUED_AFTER; a published one drops the claim."""
    started = lanes.start("ava", _queued(lanes, "ava"), "w1")
    failed = lanes.fail("ava", started.fence, error="boom", publisher="w1", claim_ttl=6)
    assert failed.retry_turn_id is not None
    assert redis_client.get(lanes.keys.claim("ava")) == f"w1|{failed.retry_turn_id}"
    clock.advance(7)
    redis_client.delete(lanes.keys.claim("ava"))  # the PX TTL ran out: same state
    [repair] = recovery.reap_claims()
    assert (repair.lane, repair.reason, repair.turn_id) == (
        "ava",
        "claim_lapsed",
        failed.retry_turn_id,
    )

    started = lanes.start("bob", _queued(lanes, "bob"), "w1")
    failed = lanes.fail("bob", started.fence, error="boom", publisher="w1", claim_ttl=6)
    assert failed.retry_turn_id is not None
    assert lanes.unclaim("bob", failed.retry_turn_id, "w1")
    assert redis_client.zrange(lanes.keys.claimed, 0, -1) == []


def test_a_stale_claim_handle_keeps_no_other_turns_claim_alive(
    lanes: Lanes, redis_client: redis.Redis, key_prefix: str, clock: VirtualClock
) -> None:
    """Prefork: the main process claims T1 on receipt, the child starts and finishes it (its
    claim gone, the main process's handle still registered); T2 is then received by worker w2,
    which dies. The stale T1 handle's renewals do not extend w2's claim (a blind PEXPIRE kept
    it alive on every pass, so recovery never re-published T2 and the lane waited 600 s)."""
    recovery = Recovery(lanes, make_breaker(redis_client, key_prefix, clock=clock), claim_ttl=0.5)
    t1 = _queued(lanes, "ava")
    assert lanes.receive("ava", t1, "main", ttl=0.5)
    renewer = Renewer(lanes, interval=100)  # passes run by hand below
    handle = ClaimHandle(lanes, "ava", t1, 0.5)
    renewer.register(handle)
    started = lanes.start("ava", t1, "child")  # deletes the claim
    lanes.finish("ava", started.fence, status="done", text="done")
    t2 = lanes.post("ava", item("two"), wake=True).turn_id
    assert t2 is not None
    assert lanes.receive("ava", t2, "w2", ttl=0.5)  # w2 then dies
    renewer.renew_now()
    assert handle.lost.is_set()  # T1's claim is gone: its handle stops
    renewer.stop()
    time.sleep(0.6)  # w2's claim (0.5 s) lapses unrenewed
    clock.advance(2)
    assert redis_client.get(lanes.keys.claim("ava")) is None
    assert [repair.turn_id for repair in recovery.reap_claims()] == [t2]

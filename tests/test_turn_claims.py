"""workers/turn/claims.py on a real Redis: receipt only queues a claim, one thread sends every
queued claim in one round trip, and a claim never outlives its turn however the start and the
claim's round trip interleave."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from tests.support.lanes import item, make_lanes
from workers.fleet.lanes import Lanes
from workers.fleet.lease import Renewer
from workers.turn.claims import Claims


@pytest.fixture
def lanes(redis_client: redis.Redis, key_prefix: str) -> Lanes:
    return make_lanes(redis_client, key_prefix)


@pytest.fixture
def claims(lanes: Lanes) -> Iterator[Claims]:
    renewer = Renewer(ttl=30, interval=100)
    claims = Claims(lanes, renewer, worker_id="w1", ttl=20)
    try:
        yield claims
    finally:
        claims.close()
        renewer.stop()


def _queued(lanes: Lanes, lane: str) -> str:
    turn_id = lanes.post(lane, item("hi"), wake=True).turn_id
    assert turn_id is not None
    return turn_id


def test_received_turns_are_claimed_and_renewed_until_they_start(
    lanes: Lanes, claims: Claims, redis_client: redis.Redis
) -> None:
    """Each received turn gets its claim key and an entry in the claimed index; start ends the
    claim and drop stops renewing it."""
    turns = {f"p{i}": _queued(lanes, f"p{i}") for i in range(5)}
    for lane, turn_id in turns.items():
        claims.receive(lane, turn_id)
    assert claims.flush()
    for lane, turn_id in turns.items():
        assert redis_client.get(lanes.keys.claim(lane)) == f"w1|{turn_id}"
    assert sorted(redis_client.zrange(lanes.keys.claimed, 0, -1)) == sorted(turns)
    assert len(claims.renewer) == 5
    for lane, turn_id in turns.items():
        assert lanes.start(lane, turn_id, "w1").status == "started"
        claims.drop(lane, turn_id)
    assert len(claims.renewer) == 0
    assert redis_client.zcard(lanes.keys.claimed) == 0


def test_a_turn_dropped_before_its_claim_was_sent_is_never_claimed(
    lanes: Lanes, claims: Claims, redis_client: redis.Redis
) -> None:
    """Start can beat the claimer thread: the queued claim is then withdrawn, not sent."""
    turn_id = _queued(lanes, "ava")
    gate = threading.Event()
    real_send = claims._send
    claims._send = lambda batch: (gate.wait(5), real_send(batch))[1]  # type: ignore[method-assign]
    claims.receive("other", "x")  # occupies the claimer thread in its round trip
    claims.receive("ava", turn_id)
    assert lanes.start("ava", turn_id, "w1").status == "started"
    claims.drop("ava", turn_id)
    gate.set()
    assert claims.flush()
    assert redis_client.exists(lanes.keys.claim("ava")) == 0
    assert len(claims.renewer) == 0


def test_a_claim_that_arrives_after_its_turn_started_is_refused_and_not_renewed(
    lanes: Lanes, claims: Claims, redis_client: redis.Redis
) -> None:
    """The claim is on its way when start runs and drop is called: receive.lua refuses it
    (the lane is no longer queued) and no handle is kept for it."""
    turn_id = _queued(lanes, "ava")
    sending, gate = threading.Event(), threading.Event()
    real_send = claims._send

    def slow_send(batch: list[tuple[str, str]]) -> list[bool]:
        sending.set()
        gate.wait(5)
        return real_send(batch)

    claims._send = slow_send  # type: ignore[method-assign]
    claims.receive("ava", turn_id)
    assert sending.wait(5)
    assert lanes.start("ava", turn_id, "w1").status == "started"
    claims.drop("ava", turn_id)
    gate.set()
    assert claims.flush()
    assert redis_client.exists(lanes.keys.claim("ava")) == 0
    assert redis_client.zcard(lanes.keys.claimed) == 0
    assert len(claims.renewer) == 0
    assert claims._claims == {}


def test_claims_queued_during_a_round_trip_go_out_together(
    lanes: Lanes, claims: Claims, redis_client: redis.Redis
) -> None:
    """What piles up while one round trip is out is sent as ONE batch."""
    batches: list[int] = []
    gate = threading.Event()
    real_send = claims._send

    def counting_send(batch: list[tuple[str, str]]) -> list[bool]:
        gate.wait(5)
        batches.append(len(batch))
        return real_send(batch)

    claims._send = counting_send  # type: ignore[method-assign]
    turns = {f"p{i}": _queued(lanes, f"p{i}") for i in range(21)}
    for lane, turn_id in turns.items():
        claims.receive(lane, turn_id)
    gate.set()
    assert claims.flush()
    assert sum(batches) == 21
    assert len(batches) <= 2  # the first alone, maybe; the rest at once
    assert redis_client.zcard(lanes.keys.claimed) == 21


def test_a_redis_failure_claims_nothing_and_raises_nothing(key_prefix: str) -> None:
    """A claim that cannot be written (Redis unreachable) is logged and dropped: the turn still
    runs, and is found by the slower reap path if the worker dies."""
    down = redis.Redis.from_url(
        "redis://127.0.0.1:1/0", socket_connect_timeout=0.5, decode_responses=True
    )
    renewer = Renewer(ttl=30, interval=100)
    claims = Claims(make_lanes(down, key_prefix), renewer, worker_id="w1", ttl=20)
    try:
        claims.receive("ava", "t1")
        assert claims.flush()
        assert claims._claims == {}
        assert len(renewer) == 0
    finally:
        claims.close()
        renewer.stop()
        down.close()

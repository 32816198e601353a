"""workers/fleet/sweeps.py: a sweep batch's one script call re-scores by compare-and-set and
folds ticks exactly as the tick script does, lane state by lane state."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import redis

from tests.support.lanes import item, make_lanes
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.sweeps import SweepWrites
from workers.local.redis_server import RedisServer
from workers.persona.clock import VirtualClock

NOW_MS = 1_700_000_000_000
CLAIM_MS = NOW_MS + 60_000


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=NOW_MS / 1000)


def _lanes_in_every_state(lanes: Lanes, client: redis.Redis, keys: Keys, tag: str) -> list[str]:
    """One lane per state a tick can meet: never seen, idle after a turn, queued (by a post),
    running (a started turn), dead-lettered; plus a queued one whose last tick was a dream."""
    fresh, idle, queued, running, dead, dreamt = (
        f"{tag}{name}" for name in ("fresh", "idle", "queued", "running", "dead", "dreamt")
    )
    client.hset(keys.lane(idle), mapping={"state": "idle", "ticks": 0})
    lanes.post(queued, item("hi"), wake=True)
    started = lanes.post(running, item("hi"), wake=True)
    assert started.turn_id is not None
    lanes.start(running, started.turn_id, "w1")
    client.hset(keys.lane(dead), mapping={"state": "dead", "ticks": 2})
    lanes.post(dreamt, item("hi"), wake=True)
    client.hset(keys.lane(dreamt), "tick_kind", "dream")
    return [fresh, idle, queued, running, dead, dreamt]


def _lane_states(client: redis.Redis, keys: Keys, lanes: list[str], tag: str) -> object:
    """The lane hashes (turn ids blanked: random) and queue index entries of ``lanes``, with
    ``tag`` cut from their names."""
    hashes = {}
    for lane in lanes:
        fields = client.hgetall(keys.lane(lane))
        hashes[lane.removeprefix(tag)] = {
            k: ("<id>" if k == "turn_id" else v) for k, v in fields.items()
        }
    scores = cast("list[tuple[str, float]]", client.zrange(keys.queued, 0, -1, withscores=True))
    return hashes, {m.removeprefix(tag): s for m, s in scores if m in lanes}


@pytest.mark.parametrize("tick", ["h", "d"])
def test_apply_folds_ticks_exactly_as_the_tick_script(
    tick: str, redis_client: redis.Redis, key_prefix: str, clock: VirtualClock
) -> None:
    """Per lane state, the sweep script's tick leaves the lane as Lanes.tick_many leaves it,
    and answers the same outcome (queued, coalesced, dead-lettered)."""
    keys = Keys(key_prefix)
    lanes = make_lanes(redis_client, key_prefix, clock=clock)
    kind = "heartbeat" if tick == "h" else "dream"
    by_script = _lanes_in_every_state(lanes, redis_client, keys, "s-")
    by_tick = _lanes_in_every_state(lanes, redis_client, keys, "t-")
    redis_client.delete(keys.queued)  # the post's queue index: rebuilt below by each path
    for lane in by_script + by_tick:
        if redis_client.hget(keys.lane(lane), "state") == "queued":
            redis_client.zadd(keys.queued, {lane: NOW_MS})
    members = [f"{lane}|{kind}" for lane in by_script]
    redis_client.zadd(keys.schedule, dict.fromkeys(members, CLAIM_MS))

    applied = SweepWrites(redis_client, keys).apply(
        CLAIM_MS, NOW_MS, [f"{member}\t{NOW_MS + 1000}\t{tick}" for member in members]
    )
    outcomes = lanes.tick_many([(lane, kind) for lane in by_tick])

    letters = {"queued": "q", "coalesced": "c", "dead_lettered": "d"}
    assert applied.codes == "".join(letters[o.outcome] for o in outcomes) == "qqccdc"
    assert _lane_states(redis_client, keys, by_script, "s-") == _lane_states(
        redis_client, keys, by_tick, "t-"
    )
    for index, lane in enumerate(by_script):
        if applied.codes[index] == "q":
            assert redis_client.hget(keys.lane(lane), "turn_id") == applied.turn_id(index)


def test_apply_rescores_only_members_still_at_their_claim_score(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Compare-and-set: a member a sync re-scored or removed after the claim keeps the sync's
    value; a skipped member ("-") is re-scored but its lane is not ticked."""
    keys = Keys(key_prefix)
    redis_client.zadd(keys.schedule, {"a|heartbeat": CLAIM_MS, "b|heartbeat": CLAIM_MS})
    redis_client.zadd(keys.schedule, {"c|heartbeat": CLAIM_MS, "d|heartbeat": CLAIM_MS + 1})
    redis_client.zadd(keys.schedule, {"b|heartbeat": 42})  # a sync re-scored b after the claim
    lines = [
        f"a|heartbeat\t{NOW_MS + 5000}\th",
        f"b|heartbeat\t{NOW_MS + 5000}\th",
        f"c|heartbeat\t{NOW_MS + 7000}\t-",
        f"e|heartbeat\t{NOW_MS + 5000}\th",  # removed by a sync: stays removed
    ]
    applied = SweepWrites(redis_client, keys).apply(CLAIM_MS, NOW_MS, lines)
    assert applied.codes == "qqq"
    scores = cast(
        "list[tuple[str, float]]", redis_client.zrange(keys.schedule, 0, -1, withscores=True)
    )
    assert dict(scores) == {
        "a|heartbeat": NOW_MS + 5000,
        "b|heartbeat": 42,
        "c|heartbeat": NOW_MS + 7000,
        "d|heartbeat": CLAIM_MS + 1,  # another batch's claim: not this call's to write
    }
    assert redis_client.exists(keys.lane("c")) == 0


def test_fields_reads_one_field_per_hash_in_order(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Missing hashes and fields read as "", in the order asked."""
    keys = Keys(key_prefix)
    redis_client.hset(keys.lane("a"), mapping={"last_post": 5, "last_pass": 7})
    reads = [
        f"{keys.lane('a')}\tlast_pass",
        f"{keys.lane('nobody')}\tlast_pass",
        f"{keys.lane('a')}\tmissing",
        f"{keys.lane('a')}\tlast_post",
    ]
    assert SweepWrites(redis_client, keys).fields(reads) == ["7", "", "", "5"]
    assert SweepWrites(redis_client, keys).fields([]) == []


def test_a_sent_apply_survives_a_script_flush_and_frees_its_connection(tmp_path: Path) -> None:
    """After SCRIPT FLUSH (a Redis restart) the in-flight call is refused before it runs; its
    answer is then the reloaded script's, applied once, and the connection is back in the pool."""
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            keys = Keys("sfx:")
            writes = SweepWrites(client, keys)
            client.zadd(keys.schedule, {"a|heartbeat": CLAIM_MS})
            client.script_flush()
            pending = writes.start_apply(CLAIM_MS, NOW_MS, [f"a|heartbeat\t{NOW_MS + 5}\th"])
            assert pending.result().codes == "q"
            assert client.hget(keys.lane("a"), "ticks") == "1"
            assert client.zscore(keys.schedule, "a|heartbeat") == NOW_MS + 5
            pool = client.connection_pool
            assert len(pool._in_use_connections) == 0
        finally:
            client.close()

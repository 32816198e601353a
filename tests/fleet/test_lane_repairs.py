"""LaneRepairs in a real Redis: repairs that must hold when Redis is full."""

from __future__ import annotations

from pathlib import Path

import redis

from tests.support.lanes import item, make_lanes
from workers.local.redis_server import RedisServer


def test_a_refused_wake_up_is_marked_for_the_reaper_even_on_a_full_redis(
    tmp_path: Path,
) -> None:
    """The broker refused a turn's wake-up because Redis is full: marking the turn for the
    reaper's next pass must not be refused too (it was: its first write was an HSET, which a
    full Redis refuses, and the lane then waited SOULFLEET_REAP_QUEUED_AFTER)."""
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            lanes = make_lanes(client, "full:")
            outcome = lanes.post("ava", item("hello"), wake=True)
            assert outcome.turn_id is not None
            client.config_set("maxmemory", 1)
            assert lanes.unsent([("ava", outcome.turn_id)], "OOM") == 1
            client.config_set("maxmemory", 0)
            assert lanes.status("ava")["queued_at"] == 0.0
            assert client.zscore(lanes.keys.queued, "ava") == 0.0
        finally:
            client.config_set("maxmemory", 0)
            client.close()

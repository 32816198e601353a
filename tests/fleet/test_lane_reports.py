"""LaneReports: what people read about a lane, readable when Redis is full."""

from __future__ import annotations

from pathlib import Path

import redis

from tests.support.lanes import item, make_lanes
from workers.local.redis_server import RedisServer


def test_status_reads_on_a_full_redis(tmp_path: Path) -> None:
    """A Redis at its maxmemory (noeviction) refuses every command queued in MULTI, reads
    included: `status` read its lane in a MULTI block and failed exactly when an operator
    needs it. It reads in a plain pipeline now, and shows the lane as it is."""
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            lanes = make_lanes(client, "full:")
            lanes.post("ava", item("hello"), wake=False)
            client.config_set("maxmemory", 1)
            status = lanes.status("ava")
            assert status["inbox_depth"] == 1
            assert status["state"] == "idle"
        finally:
            client.config_set("maxmemory", 0)
            client.close()


def test_a_lane_that_moved_on_since_it_was_read_is_not_named_lost(tmp_path: Path) -> None:
    """status reads every lane, then checks each against the index its state is kept in; a
    turn that started meanwhile (queued -> running) made a healthy lane look lost from
    lanes:queued. The check reads the lane again beside its indexes: named only if its state
    as it is now is missing from its index, also on a full Redis (which refuses MULTI)."""
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            lanes = make_lanes(client, "moved:")
            turn = lanes.post("ava", item("hello"), wake=True).turn_id
            assert turn is not None
            read_then = [("ava", "queued", "")]  # what status read before the turn started
            lanes.start("ava", turn, "w")
            assert lanes.unindexed(read_then) == []
            client.zrem(lanes.keys.running, "ava")  # now it IS lost from its index
            assert lanes.unindexed(read_then) == ["ava"]
            assert lanes.unindexed([("ava", "running", "")]) == ["ava"]
            client.config_set("maxmemory", 1)  # a full Redis still answers (no MULTI)
            assert lanes.unindexed(read_then) == ["ava"]
        finally:
            client.config_set("maxmemory", 0)
            client.close()

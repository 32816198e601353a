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

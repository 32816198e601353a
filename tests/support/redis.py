"""How the suite finds a Redis: the configured one if it answers, else one it starts itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import redis

from workers.local.redis_server import RedisServer

__all__ = ["live_redis", "reachable"]


def reachable(url: str) -> bool:
    """True when a Redis answers PING at ``url`` within a second."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


@contextlib.contextmanager
def live_redis(configured: str | None, scratch: Path) -> Iterator[str]:
    """Yield ``configured`` when it answers; else start a real redis-server and yield its URL."""
    if configured and reachable(configured):
        yield configured
        return
    with RedisServer(scratch) as server:
        yield server.url

"""The fleet's Redis clients: sized to the worker's threads, and waiting for a free connection
instead of failing a turn. Each wait is observed (``soulfleet_redis_connection_wait_seconds``),
so a pool that runs dry shows on the dashboard long before a call gives up.
"""

from __future__ import annotations

import functools
import time
from queue import Empty, LifoQueue
from typing import Any

import redis

from workers import metrics
from workers.persona.waits import waiting
from workers.pools import connections_for
from workers.settings import Settings

__all__ = ["CONNECTION_WAIT", "fleet_client", "sized_client"]


#: Seconds a thread waits for a free connection before its call fails as Redis unavailable.
CONNECTION_WAIT = 30.0


class _FreeConnections(LifoQueue[Any]):
    """A pool's free connections (redis-py's own LIFO list); a ``get`` that has to wait for one
    is timed and observed under ``client``."""

    def __init__(self, maxsize: int, *, client: str) -> None:
        super().__init__(maxsize)
        self.client = client

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        try:
            return super().get(block=False)
        except Empty:
            if not block:
                raise
        start = time.monotonic()
        try:
            with waiting():  # for another thread to give a connection back
                return super().get(block=True, timeout=timeout)
        finally:
            waited = time.monotonic() - start
            metrics.REDIS_CONNECTION_WAIT.labels(client=self.client).observe(waited)


@functools.cache
def _waiting_connection(base: type[Any]) -> type[Any]:
    """``base`` (redis-py's TCP, TLS or Unix connection) with each reply read and each connect
    marked as a wait (:mod:`workers.persona.waits`): a turn waiting on Redis lets another turn
    run. A reply is brief; a connect is not (a name lookup, a TLS handshake, up to the 5 s
    connect timeout when Redis is unreachable)."""

    def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        with waiting(brief=True):
            return base.read_response(self, *args, **kwargs)

    def connect(self: Any) -> None:
        if getattr(self, "_sock", None) is not None:  # the pool asks on every checkout
            base.connect(self)
            return
        with waiting():
            base.connect(self)

    return type(
        f"Waiting{base.__name__}", (base,), {"read_response": read_response, "connect": connect}
    )


def fleet_client(settings: Settings) -> redis.Redis:
    """The process's coordination client (``REDIS_URL``): see :func:`sized_client`."""
    return sized_client(
        settings.redis_url,
        settings,
        client="coordination",
        decode_responses=True,
        socket_connect_timeout=5,
        socket_timeout=30,
        health_check_interval=30,
    )


def sized_client(url: str, settings: Settings, *, client: str, **options: Any) -> redis.Redis:
    """A client for ``url`` with one connection per pool thread, where a caller waits for one.

    Why sized and blocking: redis-py's own pool holds at most 100 connections (since redis-py
    8; unbounded before) and raises "Too many connections" past them, and a worker's pool
    threads (200 by default) that finish their model calls together all need one at once: turns
    failed with RedisUnavailable on a healthy Redis. Connections are opened on demand, so the
    size costs nothing until used; a caller that still finds none (every connection busy in a
    slow Redis) waits for one to come back instead of failing its turn; ``client`` names it in
    the wait metric.
    """
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=connections_for(settings.worker_concurrency),
        timeout=CONNECTION_WAIT,
        queue_class=functools.partial(_FreeConnections, client=client),
        **options,
    )
    pool.connection_class = _waiting_connection(pool.connection_class)
    made = redis.Redis(connection_pool=pool)
    made.auto_close_connection_pool = True  # close() disconnects the pool, as from_url's does
    return made

"""The fleet's Redis clients (workers/fleet/clients.py) on a real Redis: every pool thread of a
worker can hold a connection at once, and a thread that finds none free waits for one instead of
failing."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis

from workers.fleet.clients import fleet_client
from workers.pools import SPARE_CONNECTIONS
from workers.settings import Settings


def _settings(redis_url: str, concurrency: int) -> Settings:
    return Settings.from_env(
        {"REDIS_URL": redis_url, "SOULFLEET_WORKER_CONCURRENCY": str(concurrency)}
    )


def test_every_pool_thread_holds_a_connection_at_once(redis_url: str, key_prefix: str) -> None:
    """200 threads (the default concurrency) each block in Redis at the same moment: none is
    refused (redis-py's own default pool stops at 100 connections and raises "Too many
    connections", which failed turns of a busy worker as RedisUnavailable)."""
    settings = _settings(redis_url, 200)
    client = fleet_client(settings)
    barrier = threading.Barrier(200)

    def hold(index: int) -> None:
        barrier.wait(timeout=30)
        client.blpop([f"{key_prefix}never:{index}"], timeout=1)

    try:
        with ThreadPoolExecutor(200) as pool:
            errors = [f.exception() for f in [pool.submit(hold, i) for i in range(200)]]
        assert errors == [None] * 200
        assert client.connection_pool.max_connections == 200 + SPARE_CONNECTIONS
    finally:
        client.close()


def test_a_thread_beyond_the_pool_waits_for_a_connection(redis_url: str, key_prefix: str) -> None:
    """With every connection taken (a ``-c`` above the settings), one more caller waits until a
    connection comes back, and every call succeeds (a plain pool refuses the extra caller)."""
    settings = _settings(redis_url, 1)
    client = fleet_client(settings)
    size = 1 + SPARE_CONNECTIONS
    barrier = threading.Barrier(size + 1)

    def hold(index: int) -> None:
        barrier.wait(timeout=30)
        client.blpop([f"{key_prefix}never:{index}"], timeout=1)

    try:
        with ThreadPoolExecutor(size) as pool:
            holders = [pool.submit(hold, i) for i in range(size)]
            barrier.wait(timeout=30)
            time.sleep(0.3)  # the holders are inside their 1 s BLPOPs now
            assert client.ping() is True
            assert [f.exception() for f in holders] == [None] * size
    finally:
        client.close()


def test_close_disconnects_the_pool(redis_url: str) -> None:
    """close() releases the sockets, as a client made by ``from_url`` does."""
    client = fleet_client(_settings(redis_url, 4))
    client.ping()
    pool = client.connection_pool
    assert isinstance(pool, redis.BlockingConnectionPool)
    client.close()
    assert all(c is None or c._sock is None for c in pool._connections)

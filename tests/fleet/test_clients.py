"""The fleet's Redis clients (workers/fleet/clients.py) on a real Redis: every pool thread of a
worker can hold a connection at once, and a thread that finds none free waits for one instead of
failing."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import redis
from prometheus_client import REGISTRY

from workers.fleet.clients import fleet_client
from workers.persona import waits
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


def _waits(client: str) -> tuple[float, float]:
    """(count, sum) of ``soulfleet_redis_connection_wait_seconds`` for ``client`` so far."""
    labels = {"client": client}
    count = REGISTRY.get_sample_value("soulfleet_redis_connection_wait_seconds_count", labels)
    total = REGISTRY.get_sample_value("soulfleet_redis_connection_wait_seconds_sum", labels)
    return count or 0.0, total or 0.0


def test_a_thread_beyond_the_pool_waits_for_a_connection(redis_url: str, key_prefix: str) -> None:
    """With every connection taken (a ``-c`` above the settings), one more caller waits until a
    connection comes back, and every call succeeds (a plain pool refuses the extra caller). The
    wait is observed in ``soulfleet_redis_connection_wait_seconds{client="coordination"}``."""
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
            before = _waits("coordination")
            assert client.ping() is True
            count, total = _waits("coordination")
            assert [f.exception() for f in holders] == [None] * size
        assert count == before[0] + 1
        assert 0.3 < total - before[1] < 5  # until a BLPOP (1 s, 0.3 s of it gone) gave one back
    finally:
        client.close()


def test_a_free_connection_is_not_a_wait(redis_url: str) -> None:
    """Calls that find a connection free add nothing to the wait metric (its fast path)."""
    client = fleet_client(_settings(redis_url, 4))
    try:
        client.ping()
        before = _waits("coordination")
        for _ in range(50):
            client.ping()
        assert _waits("coordination") == before
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


def test_each_redis_reply_is_awaited_as_a_wait(redis_url: str) -> None:
    """A turn waiting on a Redis reply does so inside the persona core's wait hook (the worker's
    baton: another turn runs meanwhile), a pipeline's replies too; so does a connect."""
    entered: list[bool] = []

    @contextlib.contextmanager
    def hook(brief: bool) -> Iterator[None]:
        entered.append(brief)
        yield

    client = fleet_client(_settings(redis_url, 4))
    waits.set_wait_hook(hook)
    try:
        assert client.ping() is True  # connects: a long wait, its handshake's replies inside
        assert entered[0] is False
        before = len(entered)
        assert client.ping() is True
        assert len(entered) == before + 1
        with client.pipeline(transaction=False) as pipe:
            pipe.ping()
            pipe.ping()
            assert pipe.execute() == [True, True]
        assert len(entered) >= before + 2
        assert all(entered[before:])  # brief: the turn goes on at once with the reply
    finally:
        waits.set_wait_hook(None)
        client.close()

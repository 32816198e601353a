"""A full Redis (noeviction at its maxmemory) must not kill a worker: it refuses writes, and
the worker waits for room as it waits for a Redis that is down."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import Harness
from workers.local.redis_server import RedisServer

pytestmark = pytest.mark.integration


def test_a_worker_started_on_a_full_redis_waits_and_then_serves(
    harness: Harness, tmp_path: Path
) -> None:
    """A worker (re)started while Redis is full: kombu's first write at connect is refused
    with OutOfMemoryError, which Celery took as unrecoverable (the worker exited, and every
    restart did the same until memory was freed). Now it stays up, retrying; once Redis has
    room again it consumes and a post is answered."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        harness.configure(REDIS_URL=server.url)
        harness.persona("ava")
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory", 1)
        worker = harness.worker(queues=("interactive",), wait=False)
        time.sleep(8.0)
        assert worker.popen.poll() is None, worker.tail()
        # Retried with a 2 s pause: 42 "Cannot connect" lines in these 8 s without it.
        refusals = worker.log_path.read_text(errors="replace").count("Cannot connect")
        assert 1 <= refusals <= 10, refusals
        client.config_set("maxmemory", 0)
        harness.answered(
            "ava", "hello after the squeeze", timeout=90, what="ava's turn once Redis has room"
        )
        assert worker.popen.poll() is None
    finally:
        harness.stop()
        server.stop()

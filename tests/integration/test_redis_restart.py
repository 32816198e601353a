"""A Redis restart under a worker that is running turns (an operator's routine: an upgrade, a
failover, an OOM kill of Redis) must not take the worker down."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from tests.support.providers import FakeProvider
from workers.local.redis_server import RedisServer

pytestmark = pytest.mark.integration


def test_a_worker_with_turns_running_survives_a_redis_restart(
    harness: Harness, tmp_path: Path
) -> None:
    """Redis is killed while a turn waits on its model call, and comes back on the same port
    with its data (AOF). The worker (threads pool, acks_late) stays up: kombu's attempt to
    give back its unacknowledged messages on the dead connection used to raise an
    AttributeError that Celery treats as unrecoverable. After the restart the worker consumes
    again and a new post is answered."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    try:
        with FakeProvider("openai", delay=3.0) as provider:
            harness.configure(REDIS_URL=server.url)
            harness.use_model_server(provider)
            harness.persona("ava")
            harness.persona("bob")
            worker = harness.worker(queues=("interactive",))
            harness.fleet.post("ava", "first")
            wait_until(lambda: provider.in_flight >= 1, timeout=30, what="a model call")
            assert server.process is not None
            server.process.kill()
            server.process.wait(10)
            time.sleep(1.0)
            server = RedisServer(tmp_path / "redis", port=server.port, persistent=True).start()
            provider.delay = 0.0
            time.sleep(3.0)
            assert worker.popen.poll() is None, worker.tail()
            harness.answered(
                "bob", "after the restart", timeout=60, what="bob's turn after the restart"
            )
            assert worker.popen.poll() is None
    finally:
        harness.stop()
        server.stop()

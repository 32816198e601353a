"""workers/publisher.py: turns published through Celery land on their kind's queue, many at once."""

from __future__ import annotations

import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from workers.fleet.errors import RedisFull, RedisUnavailable
from workers.local.redis_server import RedisServer
from workers.publisher import PUBLISH_BATCH, CeleryPublisher
from workers.queues import TURN_TASK, queue_name
from workers.settings import Settings


def _settings(redis_url: str, key_prefix: str, tmp_path: Path) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": redis_url,
            "SOULFLEET_KEY_PREFIX": key_prefix,
            "SOULFLEET_QUEUE_PREFIX": key_prefix.rstrip(":"),
            "SOULFLEET_PERSONAS": str(tmp_path),
        }
    )


def _queued(client: redis.Redis, settings: Settings, kind: str) -> list[tuple[str, list[str]]]:
    """(task name, args) of every message on ``kind``'s queue, oldest first."""
    key = f"{settings.key_prefix}broker:{queue_name(settings.queue_prefix, kind)}"
    found = []
    for raw in reversed(client.lrange(key, 0, -1)):
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], body[0]))
    return found


@pytest.mark.integration
def test_many_turns_are_published_in_order_on_their_queues(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """More turns than one pipelined batch holds, of two kinds, all arrive: each on its kind's
    queue, in the order given, as the turn task with (lane, turn id); a single turn too."""
    settings = _settings(redis_url, key_prefix, tmp_path)
    publisher = CeleryPublisher(settings)
    count = PUBLISH_BATCH * 2 + 7
    turns = [(f"lane{i}", f"turn{i}", "heartbeat" if i % 3 else "dream") for i in range(count)]
    try:
        publisher.publish_many(turns)
        publisher.publish("solo", "t-solo", "interactive")
    finally:
        publisher.close()
    for kind in ("heartbeat", "dream"):
        expected = [(TURN_TASK, [lane, turn]) for lane, turn, k in turns if k == kind]
        assert _queued(redis_client, settings, kind) == expected
    assert _queued(redis_client, settings, "interactive") == [(TURN_TASK, ["solo", "t-solo"])]


def test_every_pool_thread_can_publish_at_once(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """200 threads (a worker's default pool) publish a follow-up each at the same moment: all
    land, none is refused for want of a broker connection (redis-py's default pool stops at
    100 and raised "Too many connections" as RedisUnavailable)."""
    settings = _settings(redis_url, key_prefix, tmp_path)
    publisher = CeleryPublisher(settings)
    publisher.publish("warm", "t-warm", "interactive")  # the app and its raw client, built once
    barrier = threading.Barrier(200)

    def publish(index: int) -> None:
        barrier.wait(timeout=30)
        publisher.publish(f"lane{index}", f"turn{index}", "interactive")

    try:
        with ThreadPoolExecutor(200) as pool:
            errors = [f.exception() for f in [pool.submit(publish, i) for i in range(200)]]
    finally:
        publisher.close()
    assert errors == [None] * 200
    assert len(_queued(redis_client, settings, "interactive")) == 201


def test_a_full_broker_is_reported_as_full_not_unreachable(tmp_path: Path) -> None:
    """A broker Redis at its maxmemory refuses the turn messages: the error says Redis is full
    and what to do (it said "unavailable: check that it runs and that REDIS_URL points at
    it"), and is still a RedisUnavailable, so every caller that hands a refused wake-up to the
    reaper does so."""
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        publisher = CeleryPublisher(_settings(server.url, "full:", tmp_path))
        try:
            client.config_set("maxmemory", 1)
            with pytest.raises(RedisFull) as caught:
                publisher.publish_many([("ava", "t1", "interactive")])
            assert isinstance(caught.value, RedisUnavailable)
            assert "is full (used memory over its maxmemory)" in str(caught.value)
            assert "CONFIG SET maxmemory" in str(caught.value)
        finally:
            client.config_set("maxmemory", 0)
            publisher.close()
            client.close()

"""workers/broker.py: the Redis transport reuses one client per channel, and still delivers,
acknowledges and forgets messages exactly as kombu's does (on a real Redis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from workers import broker
from workers.app import make_app
from workers.queues import queue_name
from workers.settings import Settings


def _settings(redis_url: str, key_prefix: str, tmp_path: Path) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": redis_url,
            "SOULFLEET_KEY_PREFIX": key_prefix,
            "SOULFLEET_PERSONAS": str(tmp_path),
        }
    )


def _sent_turn(settings: Settings) -> tuple[Celery, str]:
    """The fleet's app, and its interactive queue holding one turn message for ava."""
    app = make_app(settings)
    queue = queue_name(settings.queue_prefix, "interactive")
    app.send_task("soulfleet.turn", args=["ava", "t1", "interactive"], queue=queue)
    return app, queue


def test_a_channel_builds_one_client_per_pool(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """Two synchronous broker calls share one client object; when kombu replaces the channel's
    pool (after a connection error) the next call gets a client on the new pool."""
    app = make_app(_settings(redis_url, key_prefix, tmp_path))
    try:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            assert isinstance(channel, broker.Channel)
            first = channel._create_client()
            assert channel._create_client() is first
            assert first.ping()
            stock: Any = channel  # kombu's stubs do not declare its private pool attribute
            stock._pool = None  # what kombu's _disconnect_pools does
            again = channel._create_client()
            assert again is not first
            assert again.connection_pool is channel.pool
            assert again.ping()
    finally:
        app.close()


def test_a_published_task_is_delivered_acked_and_forgotten(
    redis_url: str, key_prefix: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    """A task message sent by the app reaches a consumer on the fleet's queue with its args;
    once acked (through the shared client) kombu's unacked bookkeeping under the broker's key
    prefix is empty again."""
    app, queue = _sent_turn(_settings(redis_url, key_prefix, tmp_path))
    try:
        with app.connection_for_read() as conn:
            simple = conn.SimpleQueue(queue, no_ack=False)
            message = simple.get(timeout=5)
            assert message.headers["task"] == "soulfleet.turn"
            assert message.decode()[0] == ["ava", "t1", "interactive"]
            unacked = f"{key_prefix}broker:unacked"
            assert redis_client.hlen(unacked) == 1
            message.ack()
            assert redis_client.hlen(unacked) == 0
            simple.close()
    finally:
        app.close()


def test_acking_on_a_channel_closed_after_a_lost_connection_is_a_connection_error(
    redis_url: str, key_prefix: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    """After the broker connection is lost (a full Redis refusing the consumer, a restart)
    Celery closes the channel, which leaves it with no connection, and then acks the tasks
    that finish: that must be a connection error, which Celery logs and survives, not an
    AttributeError, which Celery takes as unrecoverable and exits the worker on. The
    message is delivered again."""
    app, queue = _sent_turn(_settings(redis_url, key_prefix, tmp_path))
    try:
        with app.connection_for_read() as conn:
            simple = conn.SimpleQueue(queue, no_ack=False)
            message = simple.get(timeout=5)
            channel: Any = message.channel
            channel.close()
            assert channel.connection is None  # what kombu's close leaves
            with pytest.raises(tuple(conn.connection_errors)):
                message.ack()
        with app.connection_for_read() as conn:
            again = conn.SimpleQueue(queue, no_ack=False).get(timeout=5)
            assert again.decode()[0] == ["ava", "t1", "interactive"]
            again.ack()
            assert redis_client.hlen(f"{key_prefix}broker:unacked") == 0
    finally:
        app.close()

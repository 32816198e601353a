"""workers/turn_messages.py: turn messages written straight to the Redis broker are the
messages send_task writes (tests/integration/test_raw_turns.py has a real worker run them)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import redis

from workers.app import make_app
from workers.queues import TURN_TASK, queue_name
from workers.settings import Settings
from workers.turn_messages import TurnMessages, raw_publishing


def _settings(redis_url: str, key_prefix: str, tmp_path: Path, **extra: str) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": redis_url,
            "SOULFLEET_KEY_PREFIX": key_prefix,
            "SOULFLEET_QUEUE_PREFIX": key_prefix.rstrip(":"),
            "SOULFLEET_PERSONAS": str(tmp_path),
            **extra,
        }
    )


def _normalized(raw: str) -> tuple[dict[str, Any], list[Any]]:
    """The envelope with its per-message values blanked, and the decoded body."""
    message = json.loads(raw)
    body = json.loads(base64.b64decode(message.pop("body")))
    headers, properties = message["headers"], message["properties"]
    assert headers["id"] == headers["root_id"] == properties["correlation_id"]
    for field in ("id", "root_id"):
        headers[field] = "<id>"
    properties["correlation_id"] = properties["delivery_tag"] = "<id>"
    return message, body


@pytest.mark.parametrize("kind", ["heartbeat", "dream", "interactive"])
def test_a_raw_turn_message_is_the_message_send_task_writes(
    kind: str, redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Decoded, the stamped envelope equals send_task's for the same turn (ids aside), its body
    carries (lane, turn id) and the kind, and it sits on the list send_task pushed to."""
    settings = _settings(redis_url, key_prefix, tmp_path)
    app = make_app(settings)
    try:
        queue = queue_name(settings.queue_prefix, kind)
        app.send_task(
            TURN_TASK, args=["ava.x-1", "t-1"], kwargs={"kind": kind}, queue=queue,
            ignore_result=True,
        )  # fmt: skip
        key = f"{settings.key_prefix}broker:{queue}"
        [sent] = redis_client.lrange(key, 0, -1)
        messages = TurnMessages(app, settings.queue_prefix)
        [(list_key, [stamped])] = messages.payloads([("ava.x-1", "t-1", kind)]).items()
    finally:
        app.close()
    assert list_key == key
    assert _normalized(stamped) == _normalized(str(sent))
    body = _normalized(stamped)[1]
    assert body[:2] == [["ava.x-1", "t-1"], {"kind": kind}]
    assert json.loads(stamped)["headers"]["argsrepr"] == "['ava.x-1', 't-1']"


def test_task_ids_and_delivery_tags_are_unique_per_message(tmp_path: Path) -> None:
    """Ten thousand turns in two calls: no task id or delivery tag repeats."""
    settings = _settings("redis://127.0.0.1:1/0", "sfx:", tmp_path)
    messages = TurnMessages(make_app(settings), settings.queue_prefix)
    ids: list[str] = []
    for _ in range(2):
        for payloads in messages.payloads(
            [(f"l{i}", f"t{i}", "dream") for i in range(5000)]
        ).values():
            for raw in payloads:
                message = json.loads(raw)
                ids += [message["headers"]["id"], message["properties"]["delivery_tag"]]
    assert len(ids) == len(set(ids)) == 20_000


def test_raw_publishing_only_where_it_is_the_same_message(tmp_path: Path) -> None:
    """Task-sent events (Flower) or a non-Redis broker keep the send_task path."""
    redis_app = make_app(_settings("redis://127.0.0.1:1/0", "sfx:", tmp_path))
    events_app = make_app(
        _settings("redis://127.0.0.1:1/0", "sfx:", tmp_path, SOULFLEET_TASK_EVENTS="1")
    )
    amqp_app = make_app(
        _settings("redis://127.0.0.1:1/0", "sfx:", tmp_path, CELERY_BROKER_URL="amqp://guest@x//")
    )
    assert raw_publishing(redis_app)
    assert not raw_publishing(events_app)
    assert not raw_publishing(amqp_app)

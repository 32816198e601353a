"""Turn messages written straight to the Redis broker: Celery's message, built once per kind.

A nightly cron can queue 100,000 dream turns at once. Through ``send_task`` each message costs
a routing lookup, a fresh protocol-2 message, kombu's serialization and envelope and a
publish call, about a millisecond of Python per turn. Every turn message differs from the
next only in its lane, turn id, task id and delivery tag, so :class:`TurnMessages` asks
Celery for one message per kind with placeholder values (:meth:`celery.app.amqp.AMQP.
as_task_v2`, serialized with kombu's JSON serializer), lays it out as kombu's Redis transport
stores it (the JSON envelope with a base64 body, ``delivery_info`` with the anonymous exchange
and the queue as routing key, a ``delivery_tag``, priority 0), and stamps the four values into
that text per turn. The envelopes of one queue go out as ONE ``LPUSH`` per
:data:`PUSH_BATCH` (values pushed in order, so the worker's ``BRPOP`` takes them in order).

It is the transport's own storage format, so a worker cannot tell these from ``send_task``'s
(``tests/integration/test_raw_turns.py`` has a real worker consume them, and
``tests/test_turn_messages.py`` checks the decoded envelope against one ``send_task`` wrote).
:func:`raw_publishing` says when this path
is NOT taken: a broker other than Redis, task-sent events on (Flower), a publish signal
receiver, or a publish from inside a running task (whose root and parent ids Celery fills in).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from typing import Any

from celery import Celery, signals
from kombu.serialization import dumps as kombu_dumps
from kombu.utils.json import dumps as envelope_dumps

from workers.broker import is_redis
from workers.queues import TURN_TASK, queue_name

__all__ = ["PUSH_BATCH", "TurnMessages", "raw_publishing"]

#: Messages per LPUSH command.
PUSH_BATCH = 1000

_JSON_STRING = json.encoder.encode_basestring_ascii
# Placeholders Celery and kombu carry through untouched (plain ASCII letters and digits).
_TOKENS = {
    "lane": "SFLANE7f3a91",
    "turn": "SFTURN7f3a91",
    "id": "SFTASKID7f3a91",
    "argsrepr": "SFARGSREPR7f3a91",
    "body": "SFBODY7f3a91",
    "tag": "SFTAG7f3a91",
}


def raw_publishing(app: Celery) -> bool:
    """Whether turn messages may be written straight to the broker (see the module doc)."""
    conf = app.conf
    return (
        is_redis(str(conf.broker_url or ""))
        and not conf.task_send_sent_event
        and int(conf.task_protocol or 2) == 2
        and conf.task_serializer == "json"
        and not conf.task_compression
        and not signals.before_task_publish.receivers
        and not signals.after_task_publish.receivers
        and app.current_worker_task is None
    )


class _Template:
    """One kind's message with ``%(name)s`` slots: the body JSON and the envelope JSON."""

    def __init__(self, app: Celery, queue: str, kind: str) -> None:
        self.key = ""  # the broker list, set by TurnMessages
        t = _TOKENS
        message = app.amqp.as_task_v2(
            t["id"],
            TURN_TASK,
            args=(t["lane"], t["turn"]),
            kwargs={"kind": kind},
            reply_to=app.thread_oid,
            ignore_result=True,
        )
        headers, properties, body, _ = message
        headers["argsrepr"] = t["argsrepr"]
        content_type, content_encoding, data = kombu_dumps(body, serializer="json")
        text = data if isinstance(data, str) else data.decode()
        self.body = _slots(text.replace("%", "%%"), ("lane", "turn"))
        envelope: dict[str, Any] = {
            "body": t["body"],
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": {
                **properties,
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": t["tag"],
            },
        }
        self.envelope = _slots(
            envelope_dumps(envelope).replace("%", "%%"), ("id", "argsrepr", "body", "tag")
        )


def _slots(text: str, names: Sequence[str]) -> str:
    for name in names:
        quoted = f'"{_TOKENS[name]}"'
        if quoted not in text:
            raise RuntimeError(f"Celery's turn message has no {name} where expected")
        text = text.replace(quoted, f"%({name})s")
    return text


class TurnMessages:
    """Builds the broker payloads of turn messages for one Celery app (one fleet)."""

    def __init__(self, app: Celery, queue_prefix: str) -> None:
        self._app = app
        self._prefix = queue_prefix
        options = app.conf.broker_transport_options or {}
        self._key_prefix = str(options.get("global_keyprefix", ""))
        self._templates: dict[str, _Template] = {}

    def key(self, kind: str) -> str:
        """The Redis list kombu's transport keeps the queue of ``kind`` in."""
        return f"{self._key_prefix}{queue_name(self._prefix, kind)}"

    def payloads(self, turns: Sequence[tuple[str, str, str]]) -> dict[str, list[str]]:
        """The envelopes of ``(lane, turn_id, kind)`` turns, in order, by broker list key."""
        out: dict[str, list[str]] = {}
        # Task ids and delivery tags: uuid4's first 24 characters per call and a 12-digit
        # counter (UUID-shaped and unique, without two uuid4 calls per message).
        ids, tags = str(uuid.uuid4())[:24], str(uuid.uuid4())[:24]
        b64 = base64.b64encode
        for index, (lane, turn_id, kind) in enumerate(turns):
            template = self._templates.get(kind)
            if template is None:
                queue = queue_name(self._prefix, kind)
                template = self._templates[kind] = _Template(self._app, queue, kind)
                template.key = f"{self._key_prefix}{queue}"
            body = template.body % {"lane": _JSON_STRING(lane), "turn": _JSON_STRING(turn_id)}
            envelope = template.envelope % {
                "id": f'"{ids}{index:012x}"',
                "argsrepr": _JSON_STRING(repr([lane, turn_id])),
                "body": f'"{b64(body.encode()).decode()}"',
                "tag": f'"{tags}{index:012x}"',
            }
            bucket = out.get(template.key)
            if bucket is None:
                bucket = out[template.key] = []
            bucket.append(envelope)
        return out

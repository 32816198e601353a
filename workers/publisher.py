"""Publishing turn wake-ups through Celery: the seam between the fleet and its broker.

:class:`~workers.fleet.Fleet` coordinates through Redis and never imports Celery; whoever builds
one hands it a :class:`~workers.fleet.host.Publisher`. This module is the Celery one, and
:func:`connect` is what a host process (the CLI, a web app, a shell on a worker) calls::

    from workers.publisher import connect
    fleet = connect()                     # settings from the environment
    fleet.post("ava", "hello")
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import redis
from celery import Celery
from kombu.exceptions import OperationalError as BrokerError

from workers.app import make_app
from workers.broker_urls import redis_py_url
from workers.fleet import Fleet
from workers.fleet.clients import sized_client
from workers.fleet.errors import redis_refusal
from workers.persona.clock import Clock
from workers.queues import KINDS, TURN_TASK, queue_name
from workers.settings import Settings
from workers.turn_messages import PUSH_BATCH, TurnMessages, raw_publishing

__all__ = ["PUBLISH_BATCH", "CeleryPublisher", "connect"]

#: Messages per pipelined round trip when publishing many turns at once.
PUBLISH_BATCH = 1000


class CeleryPublisher:
    """Publishes ``soulfleet.turn(lane, turn_id, kind=...)`` to the queue of the turn's kind.

    The lane (the persona, or ``<persona>-dreamer``) and the kind travel in the message's args
    and kwargs, so Flower's task list says whose turn each row is and what kind, while the task
    NAME stays one for the whole fleet (a metric label must not grow with the fleet).

    It uses a Celery app built from the same settings as the fleet (or the worker's own app),
    so a host process publishes to the broker and key prefix its settings name, whatever the
    process environment says. On a Redis broker the messages are written straight to the
    queue lists in Celery's own format (:mod:`workers.turn_messages`, about 20x cheaper per
    turn than ``send_task``); otherwise, and whenever that module says it must not, through
    ``send_task`` with kombu's pipelined publish batch.
    """

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self._settings = settings
        self._prefix = settings.queue_prefix
        self._app = app
        self._owns_app = app is None
        self._lock = threading.Lock()
        self._messages: TurnMessages | None = None
        self._broker: redis.Redis | None = None
        self._declared: set[str] = set()

    @property
    def app(self) -> Celery:
        with self._lock:
            if self._app is None:
                self._app = make_app(self._settings)
            return self._app

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        self.publish_many([(lane, turn_id, kind)])

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        if not turns:
            return
        app = self.app
        if raw_publishing(app):
            self._push(app, turns)
            return
        try:
            # One pooled producer for the whole batch: a sweep may queue thousands of turns,
            # and kombu's publish batch (5.7+) sends them as pipelined LPUSH round trips of
            # PUBLISH_BATCH messages instead of one round trip each.
            with app.producer_or_acquire() as producer, _batch(producer, len(turns)):
                declared: set[str] = set()
                for lane, turn_id, kind in turns:
                    queue = queue_name(self._prefix, kind)
                    # Declaring (binding) a queue once per batch is enough; per message it
                    # was a quarter of the publishing cost. Retries: a failed batch raises,
                    # and the reaper re-publishes its lanes (they are already queued).
                    extra: dict[str, Any] = {"declare": [], "retry": False}
                    if queue not in declared:
                        declared.add(queue)
                        extra = {}
                    app.send_task(
                        TURN_TASK,
                        args=[lane, turn_id],
                        kwargs={"kind": kind},
                        queue=queue,
                        producer=producer,
                        ignore_result=True,
                        **extra,
                    )
        except (BrokerError, redis.RedisError) as exc:
            # The lane is already queued: the reaper re-publishes it once the broker is back.
            raise redis_refusal(self._settings.broker_url, exc) from exc

    def _push(self, app: Celery, turns: Sequence[tuple[str, str, str]]) -> None:
        """Write the turn messages straight to their broker lists (:mod:`workers.turn_messages`):
        one LPUSH per PUSH_BATCH messages, all in one pipelined round trip."""
        with self._lock:
            if self._messages is None or self._broker is None:
                self._messages = TurnMessages(app, self._prefix)
                # Every pool thread may publish a follow-up at once: sized like the fleet's.
                self._broker = sized_client(
                    redis_py_url(self._settings.broker_url), self._settings, client="publisher"
                )
            messages, broker = self._messages, self._broker
        try:
            for kind in {kind for _, _, kind in turns} - self._declared:
                # What send_task's first message did: bind the queue (once per publisher).
                with app.producer_or_acquire() as producer:
                    producer.maybe_declare(app.amqp.queues[queue_name(self._prefix, kind)])
                self._declared.add(kind)
            pipe = broker.pipeline(transaction=False)
            for key, payloads in messages.payloads(turns).items():
                for start in range(0, len(payloads), PUSH_BATCH):
                    pipe.lpush(key, *payloads[start : start + PUSH_BATCH])
            pipe.execute()
        except (BrokerError, redis.RedisError) as exc:
            # The lane is already queued: the reaper re-publishes it once the broker is back.
            raise redis_refusal(self._settings.broker_url, exc) from exc

    def consumers(self, kind: str, *, timeout: float = 1.0) -> list[str]:
        """Workers that answer a remote-control ping and consume the queue of ``kind``.

        Empty when none does (or none answered within ``timeout``): a turn queued there waits
        for a worker that is not coming.
        """
        return self.consumers_by_kind(timeout=timeout)[kind]

    def consumers_by_kind(self, *, timeout: float = 1.0) -> dict[str, list[str]]:
        """:meth:`consumers` of every turn kind, from one remote-control round trip."""
        replies = self.app.control.inspect(timeout=timeout).active_queues() or {}
        found: dict[str, list[str]] = {}
        for kind in KINDS:
            queue = queue_name(self._prefix, kind)
            found[kind] = sorted(
                worker
                for worker, queues in replies.items()
                if any(isinstance(q, dict) and q.get("name") == queue for q in queues or ())
            )
        return found

    def close(self) -> None:
        """Release the broker connections of an app this publisher built itself."""
        with self._lock:
            if self._app is not None and self._owns_app:
                self._app.close()
                self._app = None
            if self._broker is not None:
                self._broker.close()
                self._broker = None
                self._messages = None


def _batch(producer: Any, count: int) -> AbstractContextManager[object]:
    """kombu's publish batch for more than one message, when this kombu has one."""
    batch = getattr(producer, "batch", None)
    if count < 2 or batch is None:
        return contextlib.nullcontext()
    return cast("AbstractContextManager[object]", batch(max_size=PUBLISH_BATCH))


def connect(settings: Settings | None = None, *, clock: Clock | None = None) -> Fleet:
    """A :class:`Fleet` on ``settings`` (default: the environment) publishing through Celery."""
    settings = settings if settings is not None else Settings.from_env()
    return Fleet(settings, publisher=CeleryPublisher(settings), clock=clock)

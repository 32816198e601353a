"""A command waiting on Redis says so instead of hanging silently.

A Redis that is paused (``CLIENT PAUSE``, as a failover or a managed service's maintenance
does), busy with one slow command (a ``KEYS`` over millions of keys, a big ``DEBUG``), or still
loading its data after a restart answers nothing until it is done; the CLI's client waits up to
its 30 s socket timeout before it fails. The operator running ``status`` meanwhile saw a
command that did nothing. :class:`StallNotice` times each reply (and connect) of the CLI's
Redis client and, when one has waited :data:`NOTICE_AFTER` seconds, prints one line on stderr
naming the Redis and the likely causes; the command goes on waiting as before.

Only the CLI's own client is watched (:func:`watched_client`): the workers' waits are marked
for the turn baton (:mod:`workers.persona.waits`), and a model call's wait is no Redis stall.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["NOTICE_AFTER", "StallNotice", "watched_client"]

#: Seconds a Redis reply is waited for before the command says so.
NOTICE_AFTER = 3.0


class StallNotice:
    """Says once per stall, on ``echo``, that Redis at ``where`` has not answered for
    ``after`` seconds. One daemon thread, started at the first wait, checks twice a second."""

    def __init__(
        self, where: str, echo: Callable[[str], None], *, after: float | None = None
    ) -> None:
        self.where = where
        self.echo = echo
        self.after = NOTICE_AFTER if after is None else after
        self._lock = threading.Lock()
        self._waiting: dict[int, float] = {}  # thread id -> when its wait began (monotonic)
        self._told: set[int] = set()
        self._watcher: threading.Thread | None = None
        self._closed = threading.Event()

    def begin(self) -> None:
        with self._lock:
            self._waiting[threading.get_ident()] = time.monotonic()
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="redis-stall-notice", daemon=True
                )
                self._watcher.start()

    def end(self) -> None:
        with self._lock:
            ident = threading.get_ident()
            self._waiting.pop(ident, None)
            self._told.discard(ident)

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        while not self._closed.wait(0.5):
            now = time.monotonic()
            with self._lock:
                late = [
                    (ident, now - since)
                    for ident, since in self._waiting.items()
                    if now - since >= self.after and ident not in self._told
                ]
                self._told.update(ident for ident, _ in late)
            if late:
                waited = max(seconds for _, seconds in late)
                self.echo(
                    f"soulfleet: Redis at {self.where} has not answered for {waited:.0f}s "
                    "(paused by CLIENT PAUSE or a failover, busy with a slow command, or still "
                    "loading its data): still waiting, up to its 30s socket timeout"
                )


def watched_client(client: redis.Redis, notice: StallNotice) -> redis.Redis:
    """``client`` with every reply read and every connect of its pool timed by ``notice``."""
    pool = client.connection_pool
    pool.connection_class = _watched(pool.connection_class, notice)
    return client


def _watched(base: type[Any], notice: StallNotice) -> type[Any]:
    def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        notice.begin()
        try:
            return base.read_response(self, *args, **kwargs)
        finally:
            notice.end()

    def connect(self: Any) -> None:
        notice.begin()
        try:
            base.connect(self)
        finally:
            notice.end()

    return type(f"Watched{base.__name__}", (base,), {"read_response": read_response,
                                                     "connect": connect})  # fmt: skip

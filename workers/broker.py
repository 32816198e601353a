"""The Redis broker transport soulfleet's Celery apps use: kombu's, with one client per channel.

Why: kombu's Redis channel builds a new ``redis.Redis`` client object for every synchronous
broker call it makes without one (``Channel.conn_or_acquire`` → ``_create_client``): the
bookkeeping of every delivered message (``QoS.append``), every ack and every publish. Building a
client costs about 0.2 ms of CPU (redis-py fills a table of ~200 reply callbacks each time),
which is a tenth of what a whole no-op task costs a thread-pool worker. The client holds no
connection of its own (connections come from the channel's pool for each command, and a
pipeline is made per call), so one client per channel and pool serves every thread; it is made
again whenever the channel replaces its pool (after a connection error).

It also keeps a lost broker connection (see :meth:`Channel._create_client`), a full Redis or
one failing over (see :class:`Transport` and :meth:`Channel._brpop_read`) from killing the
worker.

Installed for ``redis://`` and ``rediss://`` by :func:`install`, which :func:`workers.app.make_app`
calls: kombu picks a transport by the URL's scheme, so its alias table is the one place to say
which class serves it (a ``transport=`` argument is overridden by the scheme). Sentinel URLs keep
kombu's own transport.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import redis
from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport", "install", "is_redis"]

_PATH = f"{__name__}:Transport"
#: Seconds a worker's consumer waits before trying a full Redis again (see Transport).
FULL_REDIS_PAUSE = 2.0
#: The reply that ends a waiting BRPOP when the server's role changes (a failover, a demotion).
_FAILOVER_REPLY = "UNBLOCKED"
#: Refusals of a Redis that answers but will not take the consumer's writes or reads for a
#: while: full (noeviction at maxmemory), a demoted master, a replica without its master.
_REFUSING = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
)
#: Broker URLs served by kombu's Redis transport (a Unix socket is ``redis+socket://``:
#: :mod:`workers.broker_urls`).
_REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://")


def is_redis(broker_url: str) -> bool:
    """Whether ``broker_url`` is a Redis broker (so Redis transport options apply)."""
    return broker_url.startswith(_REDIS_SCHEMES)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, reusing one synchronous client per connection pool."""

    _soulfleet_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        # kombu's type stubs do not declare this private hook.
        stock: Any = super()
        if self.connection is None or self.connection.client is None:
            # The broker connection was lost and Celery has detached the transport from it
            # (or closed this channel, which drops its connection); closing the channel now
            # (giving back unacknowledged messages) or acking a finished task reaches here.
            # kombu would build a pool from the missing connection's URL and fail with an
            # AttributeError, which Celery treats as unrecoverable: the worker exited on every
            # Redis restart (or full Redis) that found it running turns. A connection error is
            # what both callers expect and ignore; the messages stay in Redis's unacked index
            # and the lanes' own recovery re-runs their turns.
            raise redis.exceptions.ConnectionError(
                "the broker connection is closed (lost; Celery reconnects)"
            )
        if asynchronous:
            return stock._create_client(asynchronous=True)
        pool = self.pool
        client = self._soulfleet_client
        if client is None or client.connection_pool is not pool:
            # No lock: two threads racing here build two equivalent clients and one is kept.
            client = stock._create_client(asynchronous=False)
            self._soulfleet_client = client
        return client

    def _brpop_read(self, **options: Any) -> Any:
        stock: Any = super()  # kombu's type stubs do not declare it
        try:
            return stock._brpop_read(**options)
        except redis.ResponseError as exc:
            if not str(exc).startswith(_FAILOVER_REPLY):
                raise
            # The server cut the waiting BRPOP off as it stopped being a master ("UNBLOCKED
            # force unblock ... master -> replica"): a lost connection, so the consumer
            # reconnects (and finds the new master) instead of the worker exiting.
            with contextlib.suppress(Exception):
                self.client.connection.disconnect()
            raise redis.ConnectionError(f"the broker's Redis failed over: {exc}") from exc


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`, and a full Redis taken as a lost one."""

    Channel = Channel

    # A Redis at its maxmemory under noeviction refuses kombu's writes (the unacked-restore
    # mutex at connect, a delivered message's bookkeeping) with OutOfMemoryError, a
    # ResponseError: Celery took it as unrecoverable and the worker exited, at every restart
    # too, until memory was freed (a crash loop; `soulfleet up` gave up and stopped the fleet).
    # As a connection error (Celery reads the class's tuple), the consumer retries with backoff
    # and consumes again once Redis has room; lanes whose message was lost meanwhile are
    # re-published by the reaper.
    # The same for a Redis failing over: a demoted master refuses writes (ReadOnlyError) and a
    # replica without its master refuses reads (MasterDownError); every worker exited on them
    # (a one-second demotion took the whole fleet down) where the fleet's own calls wait.
    connection_errors = (*_REFUSING, *kombu_redis.Transport.connection_errors)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        try:
            super().register_with_event_loop(connection, loop)
        except _REFUSING:
            # Celery restarts its consumer at once after this (its backoff is for errors at
            # connect): without a pause a full Redis was retried ~25 times a second, each with
            # a logged traceback (and a read-only one, mid-failover, ~6 a second with a
            # RestartFreqExceeded). The consumer has nothing else to do meanwhile.
            time.sleep(FULL_REDIS_PAUSE)
            raise


def install() -> None:
    """Serve ``redis://`` and ``rediss://`` broker URLs with :class:`Transport` (idempotent)."""
    for scheme in ("redis", "rediss"):
        kombu_transport.TRANSPORT_ALIASES[scheme] = _PATH

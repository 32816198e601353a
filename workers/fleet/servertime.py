"""The Redis server's clock, for every schedule decision beat makes.

Schedule entries are due-time scores shared by every beat. If each beat computed "now" from its
own host clock, a beat 5 s behind would re-score a changed persona to a slot the others had
already ticked (and tick it again), and a beat ahead would tick early. So beat reads time from
the one clock every beat shares: Redis's ``TIME``. :class:`ServerClock` asks for it at most
every ``refresh`` seconds and advances it in between with this host's *monotonic* clock, which
no NTP step or operator's ``date -s`` moves: one round trip per ``refresh``, and an error of
half a round trip plus the monotonic drift over ``refresh`` (microseconds).

Workers keep their own clocks: their timestamps only label what they did, and their leases
are measured in TTLs that Redis itself expires.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from workers.fleet.scripts import redis_errors
from workers.persona.clock import SystemClock, Timer

__all__ = ["ServerClock"]


class ServerClock:
    """A :class:`~workers.persona.clock.Clock` whose wall time is the Redis server's."""

    def __init__(self, client: redis.Redis, *, refresh: float = 10.0) -> None:
        self._client = client
        self._refresh = refresh
        self._lock = threading.Lock()
        self._base: tuple[float, float] | None = None  # (server time, local monotonic)
        self._local = SystemClock()

    def _sync(self) -> tuple[float, float]:
        sent = time.monotonic()
        with redis_errors(self._client):
            seconds, micros = self._client.time()
        received = time.monotonic()
        # The server read its clock somewhere in the round trip: take the middle.
        return seconds + micros / 1e6, (sent + received) / 2

    def time(self) -> float:
        with self._lock:
            base = self._base
            if base is None or time.monotonic() - base[1] >= self._refresh:
                base = self._base = self._sync()
        return base[0] + (time.monotonic() - base[1])

    def offset(self) -> float:
        """Server time minus this host's wall time (seconds; for logs and status)."""
        return self.time() - time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        self._local.sleep(seconds)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        return self._local.call_later(delay, fn)

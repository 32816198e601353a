"""Time as a boundary: every timer and timestamp in soulfleet goes through a :class:`Clock`.

:class:`SystemClock` is the real one. :class:`VirtualClock` is the in-repo fake: time moves only
when a test calls :meth:`VirtualClock.advance`, and timers fire inside that call, in due order,
so heartbeat tests are deterministic and never sleep.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from workers.persona import waits

__all__ = ["Clock", "SystemClock", "Timer", "VirtualClock"]


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Wall time, monotonic time, sleeping and one-shot timers."""

    def time(self) -> float:
        """Seconds since the epoch (wall clock; for timestamps people read)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for durations and deadlines)."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` once, ``delay`` seconds from now."""
        ...


class SystemClock:
    """The real clock. ``call_later`` runs ``fn`` on a daemon thread."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            waits.sleep(seconds)  # another turn may run meanwhile

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = threading.Timer(max(0.0, delay), fn)
        timer.daemon = True
        timer.start()
        return timer


@dataclass(order=True)
class _Pending:
    due: float
    seq: int
    fn: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """A clock that moves only when told to. Not thread-safe by design: tests drive it."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._start = start
        self._pending: list[_Pending] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now - self._start

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        pending = _Pending(self._now + max(0.0, delay), next(self._seq), fn)
        heapq.heappush(self._pending, pending)
        return pending

    def advance(self, seconds: float) -> None:
        """Move time forward, firing every timer that falls due, in order.

        A timer may schedule more timers or advance the clock itself (a slow fake model does);
        those fire too if they fall within the window.
        """
        target = self._now + max(0.0, seconds)
        while self._pending and self._pending[0].due <= target:
            pending = heapq.heappop(self._pending)
            if pending.cancelled:
                continue
            self._now = max(self._now, pending.due)
            pending.fn()
            # fn may have advanced past target itself: never move time backwards.
            target = max(target, self._now)
        self._now = max(self._now, target)

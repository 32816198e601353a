"""The baton: one turn at a time runs its Python work in a thread-pool worker.

Why: a worker's pool threads (200 by default) spend most of a turn waiting on a model, and the
rest doing work that needs the GIL. A turn's own work makes ~100 system calls (opens, stats,
writes, fsyncs, Redis round trips), and each one hands the GIL over: with many threads runnable
at once every hand-over wakes a competitor, and the same turn cost 2.9 ms of CPU on one thread,
4.2 ms with 4 and 6.3 ms with 200 (``tests/bench/bench_fleet.py``; system time tripled, all of
it futex and context switches). With the baton, the threads that are between waits queue on
one lock instead of fighting over the GIL at every system call, and a turn costs about what it
costs alone.

What it does: :meth:`Baton.held` is taken around a whole turn; every wait of the turn gives it
up for as long as it lasts (:meth:`Baton.released`, installed as the persona core's wait hook,
:mod:`workers.persona.waits`, and wrapped around each read of a Redis reply): the model call,
each tool call, each fsync, each Redis round trip, each sleep and lock wait. So other turns run
during every wait, as before; only the CPU-bound stretches between waits take turns.

Never a deadlock, never a stall longer than its patience: a thread that cannot get the baton
within ``patience`` seconds goes on without it (counted in
``soulfleet_baton_waited_out_total`` and logged at most once a minute), which is exactly how
every turn ran before the baton existed. A wait the code did not mark (it holds the baton
through it) therefore slows the other turns down by at most ``patience`` and shows up in that
counter. ``SOULFLEET_TURN_BATON=0`` turns it off; only thread pools with more than one thread
use it (prefork and solo run one turn per process, gevent switches greenlets itself).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import structlog

__all__ = ["DEFAULT_PATIENCE", "Baton"]

#: Seconds a turn waits for the baton before it runs without it.
DEFAULT_PATIENCE = 2.0
_LOG_EVERY = 60.0

_log = structlog.get_logger("soulfleet.baton")


class Baton:
    """A lock the turns of one process hand round (see the module doc).

    A turn coming back from a brief wait (a disk flush, a Redis reply: it is in the middle of a
    stretch of work) takes the baton straight away, competing only with the other such turns
    and ONE turn that is starting or back from a long wait (a model call): those pass a
    turnstile first, one at a time. As one plain lock, a turn queued behind every runnable
    turn at each of its ~9 waits, most of them a fraction of a millisecond long, and under load
    its queueing made the median turn 15-25% longer than its model call. Handing the baton over
    in a strict order (a queue, the oldest turn first) was tried: each hand-over then waits
    for the kernel to run the thread it was handed to, and under load that cost more than the
    order saved.

    ``on_waited_out`` is called each time a thread gives up waiting (the fleet counts it).
    Disabled (the default), :meth:`held` and :meth:`released` do nothing.
    """

    def __init__(
        self,
        *,
        patience: float = DEFAULT_PATIENCE,
        on_waited_out: Callable[[], None] | None = None,
    ) -> None:
        self.patience = patience
        self.enabled = False
        self._lock = threading.Lock()
        self._turnstile = threading.Lock()
        self._mine = threading.local()
        self._on_waited_out = on_waited_out
        self._logged_at = float("-inf")

    def enable(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def holding(self) -> bool:
        """Whether the calling thread holds the baton."""
        return bool(getattr(self._mine, "held", False))

    def waited(self) -> float | None:
        """Seconds the calling thread's turn has waited for the baton so far (None when the
        baton is off)."""
        return float(getattr(self._mine, "waited", 0.0)) if self.enabled else None

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the baton for the ``with`` body (a turn); nested use holds it once."""
        if not self.enabled or self.holding():
            yield
            return
        self._mine.waited = 0.0
        self._take(brief=False)
        try:
            yield
        finally:
            self._give()

    @contextmanager
    def released(self, brief: bool = False) -> Iterator[None]:
        """Give the baton up for the ``with`` body (a wait), then take it back; after a
        ``brief`` wait without passing the turnstile. A thread that does not hold it just runs
        the body."""
        if not self.holding():
            yield
            return
        self._give()
        try:
            yield
        finally:
            self._take(brief=brief)

    def _take(self, *, brief: bool) -> None:
        began = time.monotonic()
        try:
            self._acquire(brief=brief)
        finally:
            self._mine.waited = getattr(self._mine, "waited", 0.0) + time.monotonic() - began

    def _acquire(self, *, brief: bool) -> None:
        if brief:
            got = self._lock.acquire(timeout=self.patience)
        else:
            deadline = time.monotonic() + self.patience
            got = self._turnstile.acquire(timeout=self.patience)
            if got:
                try:
                    got = self._lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
                finally:
                    self._turnstile.release()
        self._mine.held = got
        if not got:
            self._waited_out()

    def _give(self) -> None:
        if getattr(self._mine, "held", False):
            self._mine.held = False
            self._lock.release()

    def _waited_out(self) -> None:
        if self._on_waited_out is not None:
            self._on_waited_out()
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY:
            self._logged_at = now
            _log.warning(
                "baton.waited_out",
                patience=self.patience,
                hint="a turn held the baton through a wait it did not mark, or the process is "
                "short of CPU: turns ran without it (as with SOULFLEET_TURN_BATON=0); see "
                "soulfleet_baton_waited_out_total",
            )

"""Read deadlines httpx cannot keep: one thread per process that cuts reads past their time.

httpx bounds each read by the timeout, not the whole answer: a provider sending its body a
byte every 59 s under a 60 s timeout holds the read, and the lane, for as long as it likes,
and one checked "is the deadline past?" between pieces still lets a try run one whole read
timeout past its deadline. :class:`Watchdog` closes that gap: a read registered with a
deadline has its socket shut down (``SHUT_RDWR``) when the deadline passes, which wakes the
blocked ``recv`` at once; :attr:`Guard.fired` then tells the reader the error it sees is the
deadline's, not the provider's.

One thread and one heap for every read of the process (a timer thread per call would cost a
thread start per model call). A guard's exit marks it done under the same lock the thread
shuts sockets under, so a connection handed back to the pool and reused is never cut for an
earlier read's deadline. The base class's ``shutdown`` is called even on a TLS socket: only
the file descriptor is shut, the TLS object is left to the reader that owns it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["WATCHDOG", "Guard", "Watchdog"]


class Guard:
    """One guarded read: :attr:`fired` once the watchdog cut its socket at the deadline."""

    __slots__ = ("done", "fired", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock: socket.socket | None = sock
        self.done = False
        self.fired = False


class Watchdog:
    """Shuts down the sockets of guarded reads whose deadline (``monotonic`` seconds) passed."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._reset()
        # A forked child (prefork pool) has neither the thread nor a usable copy of the lock.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Guard]] = []
        self._order = itertools.count()
        self._finished = 0  # guards done but still in the heap
        self._thread: threading.Thread | None = None

    @contextmanager
    def guard(self, sock: socket.socket | None, deadline: float) -> Iterator[Guard | None]:
        """Cut ``sock`` if the block is still running at ``deadline``; yields None (nothing
        guarded) for no socket."""
        if sock is None:
            yield None
            return
        guard = Guard(sock)
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._order), guard))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="soulfleet-read-watchdog", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is guard:
                self._cond.notify()  # a new earliest deadline
        try:
            yield guard
        finally:
            with self._cond:
                guard.done = True
                guard.sock = None  # the heap keeps finished guards a while: not their sockets
                # Reads end long before their deadlines: drop the finished ones in bulk
                # instead of keeping each until its deadline comes up (a timeout's worth).
                if not guard.fired:  # a fired one left the heap when it fired
                    self._finished += 1
                if self._finished > 64 and 2 * self._finished > len(self._heap):
                    self._heap = [entry for entry in self._heap if not entry[2].done]
                    heapq.heapify(self._heap)
                    self._finished = 0

    def _run(self) -> None:
        with self._cond:
            while True:
                heap = self._heap
                while heap and heap[0][2].done:
                    heapq.heappop(heap)
                    self._finished -= 1
                if not heap:
                    self._cond.wait()
                    continue
                left = heap[0][0] - self._monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                guard = heapq.heappop(heap)[2]
                guard.fired = True
                # An OSError: already closed by its reader, nothing left to wake.
                with contextlib.suppress(OSError):
                    if guard.sock is not None:
                        socket.socket.shutdown(guard.sock, socket.SHUT_RDWR)


WATCHDOG = Watchdog()

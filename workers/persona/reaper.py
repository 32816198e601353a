"""Deleting files off the caller's path: one daemon thread per process that unlinks what it is
handed, for files whose removal nobody has to wait for (pruned transcripts).

Why a thread: unlinking a file that holds data frees its blocks, and on a busy journaling
filesystem that took 1-2.5 ms per file here (an empty file: 0.04 ms), all of it on the turn that
pruned. Handing the path over costs microseconds; the thread does the unlink with the GIL
released while turns go on, and once its queue is empty it fsyncs the directories it changed:
the journal commit that carries the freed blocks is then its own, instead of landing in the
next turn's fsync (measured: that commit was most of what was left of the difference).

What callers get: :meth:`Reaper.delete` returns at once; ``path in reaper`` is true from then
until the unlink is done (so a directory listing taken meanwhile can leave the file out);
``on_done(path, ok)`` runs on the thread after each unlink (``ok`` False when it failed with
anything but "already gone", which is logged). A process that dies before the thread got to a
file leaves that file on disk: the caller's own bound must count files on disk (transcripts
do, so the next prune of that lane deletes it). At interpreter exit the thread is given
:data:`EXIT_WAIT_SECONDS` to finish; in a forked child the queue starts empty (the parent
still owns what it queued) and a new thread starts on first use.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable

import structlog

from workers.persona.writes import fsync_directory

__all__ = ["EXIT_WAIT_SECONDS", "Reaper"]

#: How long interpreter exit waits for queued deletions.
EXIT_WAIT_SECONDS = 5.0

_log = structlog.get_logger("soulfleet.reaper")
_REAPERS: weakref.WeakSet[Reaper] = weakref.WeakSet()


class Reaper:
    """A background deleter; thread-safe, fork-safe, started on first use."""

    def __init__(self, name: str, on_done: Callable[[str, bool], object] | None = None) -> None:
        self.name = name
        self._on_done = on_done
        self._reset()
        _REAPERS.add(self)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[str] = deque()
        self._pending: set[str] = set()
        self._thread: threading.Thread | None = None

    def delete(self, paths: Iterable[str]) -> None:
        """Queue ``paths`` for unlinking and return."""
        with self._cond:
            for path in paths:
                if path not in self._pending:
                    self._pending.add(path)
                    self._queue.append(path)
            if self._queue and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def __contains__(self, path: object) -> bool:
        return path in self._pending  # a set lookup: atomic, no lock needed

    def wait(self, timeout: float | None = None) -> bool:
        """Block until everything queued so far is deleted; False if ``timeout`` ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        touched: set[str] = set()
        while True:
            with self._cond:
                idle = not self._queue
            if idle and touched:
                # One commit for the whole batch, paid here rather than by whichever caller
                # fsyncs next on this filesystem.
                for directory in touched:
                    with contextlib.suppress(OSError):
                        fsync_directory(directory)
                touched.clear()
            with self._cond:
                while not self._queue:
                    # Idle threads exit, so a quiet process holds none; delete() starts another.
                    if not self._cond.wait(timeout=30.0) and not self._queue:
                        self._thread = None
                        return
                path = self._queue.popleft()
            ok = True
            touched.add(os.path.dirname(path))
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as error:
                ok = False
                _log.warning("reaper.delete_failed", path=path, error=str(error))
            try:
                if self._on_done is not None:
                    self._on_done(path, ok)
            except Exception as error:  # a callback bug must not stop deletions
                _log.warning("reaper.callback_failed", path=path, error=str(error))
            finally:
                with self._cond:
                    self._pending.discard(path)
                    self._cond.notify_all()


def _after_fork_in_child() -> None:
    for reaper in list(_REAPERS):
        reaper._reset()


def _at_exit() -> None:
    for reaper in list(_REAPERS):
        reaper.wait(EXIT_WAIT_SECONDS)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)

"""Local-mode file locks: ``fcntl.flock`` on a sidecar lock file kept open per process.

Why not filelock's ``UnixFileLock`` (what local mode used before issue 15): it opens, checks and
closes the lock file on every acquisition and walks its own reentrancy and fork bookkeeping
(about 40 ``getpid`` calls and a dozen ``stat`` calls per lock), which was a third of a memory
``add``. This is the same kernel lock with only what exclusion needs:

* **One descriptor per lock file per process, kept open.** flock belongs to the open file
  description, so one process's threads must take turns on it: :mod:`workers.persona.locks`
  queues them on a per-path threading lock first, and only the thread at its head calls
  :func:`flock_acquire`. The kernel still releases the lock the moment its holder dies. A
  worker serving thousands of personas must not hold thousands of descriptors, so at most
  :data:`MAX_OPEN` stay open: the least recently used one that is not held is closed first.
* **Forked children start afresh.** A child inherits the parent's descriptors, and with them
  the parent's open file descriptions: flocking one would "succeed" while the parent holds the
  lock. After a fork the child closes every inherited descriptor (that does not release the
  parent's lock) and opens its own. Descriptors are ``O_CLOEXEC``.
* **The lock must still be the file at the path.** Someone may remove ``.locks/`` (or one lock
  file) while we keep a descriptor on the old inode; a newcomer would then lock a new inode and
  both would "hold" the lock. After acquiring, the descriptor's inode is compared with the
  path's; if they differ the lock is dropped, the path reopened, and the attempt repeated.
* **Waiting is bounded.** ``LOCK_NB`` is retried with a short, growing sleep (0.05 ms doubling to
  1 ms: a writer holds the lock for about one fsync, so a longer sleep would leave it idle)
  until the deadline; a filesystem without flock raises its ``OSError`` (ENOSYS, ENOLCK).
  A waiter whose queued write the holder applied (``settled``) stops before its next try,
  even if the lock is free by then: taking it would only hold up the writers still waiting.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from workers.persona import waits

__all__ = ["MAX_OPEN", "flock_acquire", "flock_release"]

#: Lock-file descriptors one process keeps open between acquisitions.
MAX_OPEN = 64
_FIRST_SLEEP = 0.00005
_MAX_SLEEP = 0.001
_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)

_guard = threading.Lock()
_open: OrderedDict[str, int] = OrderedDict()
#: Paths whose descriptor a thread is using (acquiring or holding): never closed by eviction.
_busy: set[str] = set()


def _forget_after_fork() -> None:
    global _guard  # noqa: PLW0603
    _guard = threading.Lock()
    for fd in _open.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _open.clear()
    _busy.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _checkout(path: str) -> int:
    """The open descriptor of ``path`` (opened if needed), marked busy until :func:`_checkin`."""
    with _guard:
        fd = _open.get(path)
        if fd is None:
            fd = _open[path] = os.open(path, _FLAGS, 0o644)
            idle = [name for name in _open if name not in _busy and name != path]
            for name in idle[: max(0, len(_open) - MAX_OPEN)]:
                with contextlib.suppress(OSError):
                    os.close(_open.pop(name))
        else:
            _open.move_to_end(path)
        _busy.add(path)
        return fd


def _checkin(path: str) -> None:
    with _guard:
        _busy.discard(path)


def _drop(path: str, fd: int) -> None:
    with _guard:
        if _open.get(path) == fd:
            del _open[path]
    os.close(fd)


def _still_at_path(path: str, fd: int) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def flock_acquire(
    path: str,
    deadline: float | None,
    contended: Callable[[], object] | None = None,
    settled: Callable[[], bool] | None = None,
) -> bool:
    """Take the exclusive flock on ``path`` (created if missing) by ``deadline`` (monotonic; None
    waits forever). False when the deadline passed first, or once ``settled()`` (polled between
    attempts) returns True. ``contended`` is called once, before the first wait, if the lock is
    held elsewhere. Call only from the thread that holds the path's in-process gate, and pair a
    True with :func:`flock_release`."""
    try:
        if _wait(path, deadline, contended, settled):
            return True
    except BaseException:
        _checkin(path)
        raise
    _checkin(path)
    return False


def _wait(
    path: str,
    deadline: float | None,
    contended: Callable[[], object] | None,
    settled: Callable[[], bool] | None,
) -> bool:
    sleep = _FIRST_SLEEP
    while True:
        if contended is None and settled is not None and settled():
            return False  # served while asleep: taking the lock now would only hold up others
        fd = _checkout(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if contended is not None:
                contended()
                contended = None
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            waits.sleep(sleep if deadline is None else min(sleep, deadline - now))
            sleep = min(sleep * 2, _MAX_SLEEP)
            continue
        try:
            still = _still_at_path(path, fd)
        except BaseException:
            fcntl.flock(fd, fcntl.LOCK_UN)  # never leave a lock behind an error
            raise
        if still:
            return True
        # Locked an inode that is no longer the lock file: whoever opens the path now would
        # not be excluded by it. Let it go and lock the file that is there.
        _drop(path, fd)


def flock_release(path: str) -> None:
    """Release the flock on ``path`` taken by :func:`flock_acquire`; the descriptor stays open."""
    with _guard:
        fd = _open.get(path)
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        _checkin(path)

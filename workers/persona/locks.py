"""Per-path write locks that hold across threads, processes and hosts.

Why it is built this way:

* **A sidecar lock file, never the data file.** Data files are replaced atomically
  (``os.replace``), so a lock taken on the data file's inode would be on a file that is gone after
  the first write. Lock files live under ``<persona>/.locks/``, mirroring the data file's relative
  path (``.locks/MEMORY.md.lock``, ``.locks/memory/<slug>.md.lock``), so notes listings never see
  them. They are deliberately left in place: one small file per data path, never more, and
  waiters must all flock the same inode.
* **Two modes, because ``flock`` does not exclude across NFS clients.**
  ``"local"`` is ``fcntl.flock`` (filelock's :class:`~filelock.UnixFileLock`): fast, and the kernel
  releases it the moment a holder dies. Right for one host, or several hosts on a filesystem whose
  locks are coherent across clients. ``"shared"`` is filelock's
  :class:`~filelock.StrictSoftFileLock`: exclusion by immutable claim files created with
  hard links, which works on NFS-like filesystems. Its price: slower (about 0.9 ms against
  0.1 ms per uncontended acquisition on a local disk), and a holder that
  crashes mid-write leaves its claim behind, which blocks that one file until it is cleared with
  :func:`break_shared_lock` (never by age: age-based expiry could let two live writers overlap).
  The two modes use different lock files (``.lock`` vs ``.shared.lock``) and do not exclude
  each other: every worker on one persona filesystem must use the same mode.
* **A per-path threading lock in front.** Threads of one worker queue on an in-process lock first
  (cheap, fair enough), so only one thread per process ever touches the file lock.
* **Every wait is bounded.** The timeout covers both stages and ends in :class:`LockTimeout`,
  which names the file, the timeout and (shared mode) the claim holders.
* **Metrics without imports.** :func:`set_lock_wait_observer` lets the fleet export the wait time
  histogram; the core never imports prometheus.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import Literal

import structlog
from filelock import BaseFileLock, StrictSoftFileLock, Timeout, UnixFileLock

from workers.persona.errors import LockTimeout
from workers.persona.files import confined

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "LOCK_DIR",
    "LockMode",
    "LockTimeout",
    "break_shared_lock",
    "lock_file_for",
    "path_lock",
    "set_lock_wait_observer",
    "shared_lock_holders",
]

LockMode = Literal["local", "shared"]
LOCK_DIR = ".locks"
DEFAULT_LOCK_TIMEOUT = 10.0
_SUFFIX: dict[LockMode, str] = {"local": ".lock", "shared": ".shared.lock"}

_log = structlog.get_logger("soulfleet.locks")

_observer: Callable[[float], None] | None = None
_registry_guard = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}


def _reset_after_fork() -> None:
    # A lock held by another thread at fork time would never be released in the child.
    global _registry_guard, _thread_locks  # noqa: PLW0603
    _registry_guard = threading.Lock()
    _thread_locks = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def set_lock_wait_observer(fn: Callable[[float], None] | None) -> None:
    """Call ``fn(seconds_waited)`` after every lock attempt (acquired or timed out); None stops."""
    global _observer  # noqa: PLW0603
    _observer = fn


def _observe(waited: float) -> None:
    observer = _observer
    if observer is None:
        return
    try:
        observer(waited)
    except Exception:  # a broken metrics hook must never break a memory write
        _log.exception("lock.observer_failed")


def lock_file_for(
    root: str | os.PathLike[str], data: str | os.PathLike[str], mode: LockMode = "local"
) -> Path:
    """The sidecar lock file for ``data`` (a real path inside ``root``), confined to ``root``.

    Creates the lock's parent directories. Refuses (``PersonaFileError``) when ``.locks`` or a
    directory under it is a symlink leading outside the persona directory.
    """
    real_root = Path(root).resolve()
    relative = Path(data).relative_to(real_root)
    lock = confined(real_root, PurePath(LOCK_DIR) / f"{relative}{_SUFFIX[_checked(mode)]}")
    lock.parent.mkdir(parents=True, exist_ok=True)
    # mkdir may have followed a symlink created meanwhile; check the result, not the intent.
    return confined(real_root, lock.relative_to(real_root))


def _checked(mode: str) -> LockMode:
    if mode == "local":
        return "local"
    if mode == "shared":
        return "shared"
    raise ValueError(f"lock mode must be 'local' or 'shared', got {mode!r}")


def _thread_lock(lock_file: Path) -> threading.Lock:
    key = os.fspath(lock_file)
    with _registry_guard:
        lock = _thread_locks.get(key)
        if lock is None:
            lock = _thread_locks[key] = threading.Lock()
        return lock


def _file_lock(lock_file: Path, mode: LockMode) -> BaseFileLock:
    if mode == "local":
        # No soft fallback: a filesystem without flock must be a loud error (use "shared"), not
        # a silent switch to marker files that a crash would leave behind.
        return UnixFileLock(lock_file, fallback_to_soft=False)
    return StrictSoftFileLock(lock_file)


@contextmanager
def path_lock(
    lock_file: str | os.PathLike[str],
    *,
    mode: LockMode = "local",
    timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Iterator[None]:
    """Hold the lock on ``lock_file`` for the ``with`` body, across threads, processes and hosts.

    Raises :class:`LockTimeout` when it is not acquired within ``timeout`` seconds (a negative
    timeout waits forever). OS errors from the lock file itself propagate.
    """
    path = Path(lock_file)
    checked = _checked(mode)
    start = time.monotonic()
    deadline = None if timeout < 0 else start + timeout
    gate = _thread_lock(path)
    if not gate.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
        _observe(time.monotonic() - start)
        raise LockTimeout(path, timeout, checked)
    try:
        lock = _file_lock(path, checked)
        remaining = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            lock.acquire(timeout=remaining, poll_interval=0.005)
        except Timeout:
            _observe(time.monotonic() - start)
            holders = shared_lock_holders(path) if checked == "shared" else ()
            raise LockTimeout(path, timeout, checked, holders) from None
        _observe(time.monotonic() - start)
        try:
            yield
        finally:
            lock.release()
    finally:
        gate.release()


def _claims(lock_file: Path) -> tuple[tuple[str, str], ...]:
    claims = StrictSoftFileLock(lock_file).claims
    return tuple(
        (claim.name, f"{claim.state} claim by pid {claim.pid} on {claim.hostname}")
        for claim in claims
    )


def shared_lock_holders(lock_file: str | os.PathLike[str]) -> tuple[str, ...]:
    """Who holds (or is queueing for) a shared-mode lock: ``"held claim by pid N on host"``."""
    try:
        return tuple(description for _, description in _claims(Path(lock_file)))
    except OSError:
        return ()


def break_shared_lock(lock_file: str | os.PathLike[str]) -> tuple[str, ...]:
    """Remove every claim on a shared-mode lock; returns what was removed.

    For operators, after a holder crashed mid-write: first make sure no process named in
    :func:`shared_lock_holders` is still running, or two writers may overlap.
    """
    path = Path(lock_file)
    lock = StrictSoftFileLock(path)
    removed = []
    for name, description in _claims(path):
        try:
            lock.force_break(name)
        except FileNotFoundError:
            continue  # its owner withdrew it meanwhile
        removed.append(description)
        _log.warning("lock.claim_broken", lock_file=str(path), claim=description)
    return tuple(removed)

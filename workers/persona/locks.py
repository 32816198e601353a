"""Per-path write locks that hold across threads, processes and hosts.

Why it is built this way:

* **A sidecar lock file, never the data file.** Data files are replaced atomically
  (``os.replace``), so a lock taken on the data file's inode would be on a file that is gone after
  the first write. Lock files live under ``<persona>/.locks/``, mirroring the data file's relative
  path (``.locks/MEMORY.md.lock``, ``.locks/memory/<slug>.md.lock``), so notes listings never see
  them. They are deliberately left in place: one small file per data path, never more, and
  waiters must all flock the same inode.
* **Two modes, because ``flock`` does not exclude across NFS clients.**
  ``"local"`` is ``fcntl.flock`` taken directly on a descriptor kept open per process
  (:mod:`workers.persona.flock`): fast, and the kernel releases it the moment a holder dies.
  A filesystem without flock is a loud ``OSError`` (use ``"shared"``), never a silent switch
  to marker files that a crash would leave behind. Right for one host, or several hosts on a
  filesystem whose locks are coherent across clients. ``"shared"`` is filelock's
  :class:`~filelock.StrictSoftFileLock`: exclusion by immutable claim files created with
  hard links, which works on NFS-like filesystems. Its price: slower (about 25 opens and 15
  stats per acquisition: 0.9 ms on a quiet local disk, 3-5 ms on the loaded project machine,
  where local mode's flock takes 0.03-0.05 ms), and a holder that
  crashes mid-write leaves its claim behind. A claim whose holder ran on THIS host and is dead
  (pid gone, or reused by a later process) is broken automatically by the next writer that
  finds the lock contended; a claim from another host stays (its processes cannot be seen from
  here) until it is cleared with :func:`break_shared_lock`, and ``soulfleet status`` names it.
  Never by age: age-based expiry could let two live writers overlap. Before the claims, a
  shared-mode writer queues on a flock "waiting room" (``.locks/<file>.shared.lock.wait``),
  so one host's writers meet the claims one at a time instead of all polling them with
  backoff; it only orders the waiters (a claim alone still excludes), and where it cannot be
  flocked the claims alone decide.
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
from filelock import BaseFileLock, StrictSoftFileClaim, StrictSoftFileLock, Timeout

# filelock's own liveness test (pid alive AND the same process start time, pid namespaces
# told apart in the host name): private API, so pyproject pins filelock below 5.
from filelock._identity import host_name, owner_is_stale

from workers.persona.errors import LockTimeout
from workers.persona.files import confined
from workers.persona.flock import flock_acquire, flock_release

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "LOCK_DIR",
    "LockMode",
    "LockTimeout",
    "break_dead_local_claims",
    "break_shared_lock",
    "ledger_file_for",
    "lock_file_for",
    "lock_name_for",
    "path_lock",
    "set_lock_wait_observer",
    "shared_claims_under",
    "shared_lock_holders",
]

LockMode = Literal["local", "shared"]
LOCK_DIR = ".locks"
DEFAULT_LOCK_TIMEOUT = 10.0
_SUFFIX: dict[LockMode, str] = {"local": ".lock", "shared": ".shared.lock"}
_ROOM_SUFFIX = ".wait"
#: A contended shared-mode acquisition looks for dead holders this often.
_SHARED_SLICE = 0.5

_log = structlog.get_logger("soulfleet.locks")

_observer: Callable[[float], None] | None = None
_registry_guard = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}
_shared_locks: dict[str, BaseFileLock] = {}


def _reset_after_fork() -> None:
    # A lock held by another thread at fork time would never be released in the child.
    global _registry_guard, _thread_locks, _shared_locks  # noqa: PLW0603
    _registry_guard = threading.Lock()
    _thread_locks = {}
    _shared_locks = {}


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
    lock = confined(real_root, lock_name_for(Path(data).relative_to(real_root), mode))
    lock.parent.mkdir(parents=True, exist_ok=True)
    # mkdir may have followed a symlink created meanwhile; check the result, not the intent.
    return confined(real_root, lock.relative_to(real_root))


def lock_name_for(relative: str | os.PathLike[str], mode: LockMode = "local") -> PurePath:
    """Where the lock of the data file at ``relative`` lives, relative to the persona root."""
    return PurePath(LOCK_DIR) / f"{PurePath(relative)}{_SUFFIX[_checked(mode)]}"


def ledger_file_for(root: str | os.PathLike[str], data: str | os.PathLike[str]) -> Path:
    """The write ledger beside ``data``'s locks (``.locks/<relative>.applied``), confined."""
    real_root = Path(root).resolve()
    relative = Path(data).relative_to(real_root)
    ledger = confined(real_root, PurePath(LOCK_DIR) / f"{relative}.applied")
    ledger.parent.mkdir(parents=True, exist_ok=True)
    return confined(real_root, ledger.relative_to(real_root))


def _checked(mode: str) -> LockMode:
    if mode == "local":
        return "local"
    if mode == "shared":
        return "shared"
    raise ValueError(f"lock mode must be 'local' or 'shared', got {mode!r}")


def _thread_lock(key: str) -> threading.Lock:
    with _registry_guard:
        lock = _thread_locks.get(key)
        if lock is None:
            lock = _thread_locks[key] = threading.Lock()
        return lock


def _shared_lock(lock_file: Path) -> BaseFileLock:
    # One instance per lock file per process, reused: building one per acquisition cost about
    # a third of it. Only the thread holding the path's gate ever uses it.
    key = os.fspath(lock_file)
    with _registry_guard:
        lock = _shared_locks.get(key)
        if lock is None:
            lock = _shared_locks[key] = StrictSoftFileLock(lock_file)
        return lock


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
    name = os.fspath(lock_file)  # a plain string on the hot path: Path only where needed
    checked = _checked(mode)
    start = time.monotonic()
    deadline = None if timeout < 0 else start + timeout
    gate = _thread_lock(name)
    if not gate.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
        _observe(time.monotonic() - start)
        raise LockTimeout(Path(name), timeout, checked)
    try:
        if checked == "local":
            if not flock_acquire(name, deadline):
                _observe(time.monotonic() - start)
                raise LockTimeout(Path(name), timeout, checked)
            _observe(time.monotonic() - start)
            try:
                yield
            finally:
                flock_release(name)
            return
        path = Path(name)
        room = _enter_waiting_room(path, deadline)
        try:
            lock = _shared_lock(path)
            try:
                _acquire_shared(lock, path, deadline)
            except Timeout:
                _observe(time.monotonic() - start)
                raise LockTimeout(path, timeout, checked, shared_lock_holders(path)) from None
            _observe(time.monotonic() - start)
            try:
                yield
            finally:
                lock.release()
        finally:
            if room is not None:
                flock_release(room)
    finally:
        gate.release()


def _enter_waiting_room(path: Path, deadline: float | None) -> str | None:
    """Queue this host's shared-mode writers of ``path`` on a flock before the claims.

    Only an optimisation: exclusion is the strict claims'. Contenders that all poll the claim
    directory back off up to 50 ms each and leave the lock idle (4 processes on one file ran at
    a third of one process's rate); queued on a flock, they meet the claims one at a time. Where
    flock is missing (ENOLCK, ENOSYS) or not granted in time, the claims alone decide.
    """
    room = f"{os.fspath(path)}{_ROOM_SUFFIX}"
    try:
        return room if flock_acquire(room, deadline) else None
    except OSError:
        return None


def _acquire_shared(lock: BaseFileLock, path: Path, deadline: float | None) -> None:
    """Acquire a strict soft lock, breaking claims left by DEAD processes of this host.

    The uncontended case is one attempt. When it is contended, every wait slice first removes
    claims whose holder ran on this host and is gone (its pid no longer runs, or now belongs to
    a process started later): a crashed writer never blocks the file. A claim from another host
    is never touched (we cannot see its processes); it stays until its owner releases it or an
    operator clears it (``soulfleet status`` names it; :func:`break_shared_lock`).
    """
    try:
        lock.acquire(timeout=0, poll_interval=0.005)
        return
    except Timeout:
        pass
    while True:
        break_dead_local_claims(path)
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise Timeout(str(path))
        step = _SHARED_SLICE if remaining is None else min(_SHARED_SLICE, remaining)
        try:
            lock.acquire(timeout=step, poll_interval=0.005)
            return
        except Timeout:
            continue


def _holder_is_dead(claim: StrictSoftFileClaim) -> bool:
    # Only this host's processes can be checked; the start token tells a reused pid apart.
    return claim.hostname == host_name() and owner_is_stale(claim.pid, claim.hostname, claim.start)


def break_dead_local_claims(lock_file: str | os.PathLike[str]) -> tuple[str, ...]:
    """Remove the claims on a shared-mode lock whose holder was a process on THIS host that
    no longer runs; returns what was removed (each logged as ``lock.dead_claim_broken``)."""
    path = Path(lock_file)
    lock = StrictSoftFileLock(path)
    try:
        claims = lock.claims
    except Exception as exc:  # an unreadable claim directory: nothing we can safely break
        _log.warning("lock.claims_unreadable", lock_file=str(path), error=str(exc))
        return ()
    removed = []
    for claim in claims:
        if not _holder_is_dead(claim):
            continue
        description = f"{claim.state} claim by pid {claim.pid} on {claim.hostname}"
        try:
            lock.force_break(claim.name)
        except (FileNotFoundError, ValueError):
            continue  # withdrawn meanwhile
        removed.append(description)
        _log.warning(
            "lock.dead_claim_broken",
            lock_file=str(path),
            claim=description,
            reason="its process no longer runs on this host",
        )
    return tuple(removed)


def shared_claims_under(root: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """Every claim on a shared-mode lock under ``<root>/.locks``: (data path, who holds it).

    For ``soulfleet status``: a claim that stays is a writer at work, or one on another host
    that crashed (this host's dead claims are broken automatically)."""
    locks = Path(root) / LOCK_DIR
    found: list[tuple[str, str]] = []
    if not locks.is_dir():
        return found
    suffix = _SUFFIX["shared"]
    for lock_file in sorted(locks.rglob(f"*{suffix}")):
        if not lock_file.is_file():
            continue
        data = str(lock_file.relative_to(locks))[: -len(suffix)]
        found.extend((data, holder) for holder in shared_lock_holders(lock_file))
    return found


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

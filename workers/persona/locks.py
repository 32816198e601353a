"""Per-path write locks that hold across threads, processes and hosts.

Why it is built this way:

* **A sidecar lock file, never the data file.** Data files are replaced atomically
  (``os.replace``) by every write but an in-place ``add``, so a lock taken on the data file's
  inode would be on a file that is gone after the next replace. Lock files live under
  ``<persona>/.locks/``, mirroring the data file's relative path (``.locks/MEMORY.md.lock``,
  ``.locks/memory/<slug>.md.lock``), so notes listings never see them. They are deliberately
  left in place: one small file per data path, never more, and waiters must all flock the same
  inode.
* **Two modes, because ``flock`` does not exclude across NFS clients.**
  ``"local"`` is ``fcntl.flock`` taken directly on a descriptor kept open per process
  (:mod:`workers.persona.flock`): fast, and the kernel releases it the moment a holder dies.
  A filesystem without flock is a loud ``OSError`` (use ``"shared"``), never a silent switch
  to marker files that a crash would leave behind. Right for one host, or several hosts on a
  filesystem whose locks are coherent across clients. ``"shared"`` is a claim file published
  with a hard link (:mod:`workers.persona.shared_claims`), which excludes on NFS-like
  filesystems: one ``link`` to acquire and one ``unlink`` to release, behind a per-host flock
  waiting room. Its price: a holder that crashes mid-write leaves its claim behind: this
  machine's dead claims are broken by its next writer, another machine's stay until
  :func:`break_shared_lock` (``soulfleet status`` names them). Never by age: age-based expiry
  could let two live writers overlap.
  The two modes use different lock files (``.lock`` vs ``.claim``) and do not exclude each
  other: every worker on one persona filesystem must use the same mode (and, in shared mode,
  the same claim protocol: the filelock claims of releases before issue 15's are not seen).
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

from workers.persona.errors import LockTimeout
from workers.persona.files import confined, make_dirs
from workers.persona.flock import flock_acquire, flock_release
from workers.persona.memory_spec import NOTES_DIR
from workers.persona.owner_records import CLAIM_SUFFIX
from workers.persona.shared_claims import (
    acquire_claim,
    break_shared_lock,
    enter_waiting_room,
    release_claim,
    shared_lock_holders,
)
from workers.persona.waits import waiting

__all__ = [
    "CLAIM_SUFFIX",
    "DEFAULT_LOCK_TIMEOUT",
    "LOCK_DIR",
    "LockMode",
    "LockTimeout",
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
#: How often a thread waiting for a path's gate checks whether its write was settled.
_SETTLED_POLL = 0.001
_SUFFIX: dict[LockMode, str] = {"local": ".lock", "shared": CLAIM_SUFFIX}

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
    lock = confined(real_root, lock_name_for(Path(data).relative_to(real_root), mode))
    make_dirs(real_root, lock.parent)
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
    make_dirs(real_root, ledger.parent)
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


@contextmanager
def path_lock(
    lock_file: str | os.PathLike[str],
    *,
    mode: LockMode = "local",
    timeout: float = DEFAULT_LOCK_TIMEOUT,
    contended: Callable[[], object] | None = None,
    settled: Callable[[], bool] | None = None,
) -> Iterator[bool]:
    """Hold the lock on ``lock_file`` for the ``with`` body, across threads, processes and hosts.

    Raises :class:`LockTimeout` when it is not acquired within ``timeout`` seconds (a negative
    timeout waits forever). OS errors from the lock file itself propagate. The body gets True.

    For writers that hand their write to the holder (the memory tool:
    :mod:`workers.persona.write_queue`): ``contended`` is called once, before waiting, when
    another thread or process holds the lock (in shared mode: another of this machine's, in the
    waiting room); ``settled`` is polled while waiting, and once it returns True the wait ends
    and the body runs WITHOUT the lock, getting False.
    """
    name = os.fspath(lock_file)  # a plain string on the hot path: Path only where needed
    checked = _checked(mode)
    start = time.monotonic()
    deadline = None if timeout < 0 else start + timeout
    gate = _thread_lock(name)
    if not gate.acquire(blocking=False):
        if contended is not None:
            contended()
            contended = None
        with waiting():  # another thread of this process holds it
            waited = _wait_gate(gate, deadline, settled)
        if not waited:
            _give_up(name, timeout, checked, start, settled)
            yield False
            return
    try:
        if checked == "shared":
            with _shared_held(
                name, deadline, timeout, start, contended=contended, settled=settled
            ) as held:
                yield held
            return
        if not flock_acquire(name, deadline, contended, settled):
            _give_up(name, timeout, checked, start, settled)
            yield False
            return
        _observe(time.monotonic() - start)
        try:
            yield True
        finally:
            flock_release(name)
    finally:
        gate.release()


def _give_up(
    name: str,
    timeout: float,
    mode: LockMode,
    start: float,
    settled: Callable[[], bool] | None,
    *,
    holders: Callable[[str], tuple[str, ...]] | None = None,
) -> None:
    """A wait ended without the lock: raise :class:`LockTimeout` (naming the ``holders`` of
    ``name`` where they can be told), unless it was settled."""
    _observe(time.monotonic() - start)
    if settled is None or not settled():
        raise LockTimeout(Path(name), timeout, mode, () if holders is None else holders(name))


@contextmanager
def _shared_held(
    name: str,
    deadline: float | None,
    timeout: float,
    start: float,
    *,
    contended: Callable[[], object] | None,
    settled: Callable[[], bool] | None,
) -> Iterator[bool]:
    room = enter_waiting_room(name, deadline, contended, settled)
    try:
        if room is None and settled is not None and settled():
            _observe(time.monotonic() - start)
            yield False  # applied by this machine's writer in the room
            return
        # Only a writer in the room may break a dead claim: the room makes it the only one.
        if not acquire_claim(name, deadline, may_break=room is not None):
            _give_up(name, timeout, "shared", start, settled, holders=shared_lock_holders)
            yield False
            return
        _observe(time.monotonic() - start)
        try:
            yield True
        finally:
            release_claim(name)
    finally:
        if room is not None:
            flock_release(room)


def _wait_gate(
    gate: threading.Lock, deadline: float | None, settled: Callable[[], bool] | None
) -> bool:
    """Wait for a path's in-process gate; False at the deadline or once ``settled()``."""
    if settled is None:
        return gate.acquire(
            timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())
        )
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        step = _SETTLED_POLL if remaining is None else min(_SETTLED_POLL, remaining)
        if gate.acquire(timeout=step):
            return True
        if settled():
            return False


def shared_claims_under(root: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """Every claim on a shared-mode lock under ``<root>/.locks``: (data path, who holds it).

    For ``soulfleet status``: a claim that stays is a writer at work, or one whose writer died
    where its death cannot be seen from here (another machine; or this one without flock).
    Only where claims live (``.locks/`` and ``.locks/memory/``, one per data file), whatever
    is at the claim path, so an older release's files under ``*.filelock/`` are not listed."""
    locks = os.path.join(root, LOCK_DIR)
    found: list[tuple[str, str]] = []
    for sub in ("", NOTES_DIR):  # the notes' locks mirror memory/<slug>.md
        try:
            with os.scandir(os.path.join(locks, sub)) as entries:
                names = sorted(e.name for e in entries if e.name.endswith(f".md{CLAIM_SUFFIX}"))
        except OSError:  # no .locks (or no notes) yet
            continue
        for name in names:
            data = os.path.join(sub, name[: -len(CLAIM_SUFFIX)])
            claim = os.path.join(locks, sub, name)
            found.extend((data, holder) for holder in shared_lock_holders(claim))
    return found

"""Shared lock mode: exclusion by filelock's :class:`~filelock.StrictSoftFileLock` claims (hard
links, which hold on NFS-like filesystems where ``flock`` does not exclude across clients).

What this room adds to filelock's claims (:mod:`workers.persona.locks` says when to use the mode):

* **A waiting room.** A host's writers queue on a flock (``<lock>.wait``) before the claims, so
  they meet the claims one at a time instead of all polling them with backoff.
* **Dead claims of this host are broken.** A contended acquisition removes claims whose holder
  ran on this host and is gone (pid gone, or reused by a later process). A claim from another
  host is never touched: it stays until its owner releases it or an operator clears it with
  :func:`break_shared_lock` (``soulfleet status`` names it via :func:`shared_lock_holders`).
  Never by age: age-based expiry could let two live writers overlap.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import structlog
from filelock import BaseFileLock, StrictSoftFileClaim, StrictSoftFileLock, Timeout

# filelock's own liveness test (pid alive AND the same process start time, pid namespaces
# told apart in the host name): private API, so pyproject pins filelock below 5.
from filelock._identity import host_name, owner_is_stale

from workers.persona.flock import flock_acquire

__all__ = [
    "acquire_shared",
    "break_dead_local_claims",
    "break_shared_lock",
    "enter_waiting_room",
    "shared_lock_holders",
]

_ROOM_SUFFIX = ".wait"
#: A contended shared-mode acquisition looks for dead holders this often.
_SHARED_SLICE = 0.5

_log = structlog.get_logger("soulfleet.locks")


def enter_waiting_room(path: Path, deadline: float | None) -> str | None:
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


def acquire_shared(lock: BaseFileLock, path: Path, deadline: float | None) -> None:
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

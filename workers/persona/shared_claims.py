"""Shared lock mode: one claim file per lock, published with a hard link (safe on NFS-like
filesystems, where ``flock`` may not exclude across clients).

The protocol (:mod:`workers.persona.locks` says when to use the mode):

* **A claim is a hard link.** A process holds the lock while its owner record
  (:mod:`workers.persona.owner_records`: pid, host, process start time) is also linked at the
  claim path (``.locks/<file>.claim``). ``link(2)`` fails with EEXIST when the name exists,
  atomically on the server, on NFS too. Acquiring is one ``link``, releasing one ``unlink``:
  filelock's strict claims, used before issue 15, cost about 230 system calls per
  acquisition here.
* **A lost reply is not a lost lock.** An NFS ``link`` that succeeded but whose reply was lost
  answers EEXIST on the retry; our record then has a second link (it is linked nowhere but at
  its claim), which one ``stat`` per look tells.
* **A waiting room.** A machine's writers queue on a flock (``<claim>.wait``) first and hold
  it across the write, so this machine's contenders (containers included: they share the
  kernel) meet the claim one at a time and only writers of other machines ever poll it. Where
  flock is missing (ENOLCK, ENOSYS) the claim alone decides.
* **Dead claims of this machine are broken, by one writer at a time.** A writer that finds the
  claim held by a process of this machine that is gone
  (:func:`~workers.persona.owner_records.owner_gone`: by pid and start time in our pid
  namespace, by the lock the kernel held for it in another one) removes it, but only while it
  holds the waiting room: every writer that may break this machine's claims waits there, so
  the claim it judged dead is still the one it removes. Without a waiting room (no flock) no
  claim is broken: an operator clears it. A claim from another machine is never touched (its
  processes cannot be seen from here); it stays until its owner releases it or an operator
  clears it with :func:`break_shared_lock` (``soulfleet status`` names it via
  :func:`shared_lock_holders`). Never by age: age-based expiry could let two live writers
  overlap.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import time
from collections.abc import Callable

import structlog

from workers.persona import waits
from workers.persona.errors import PersonaFileError
from workers.persona.flock import flock_acquire
from workers.persona.owner_records import (
    CLAIM_SUFFIX,
    Claim,
    describe,
    known_record,
    owner_gone,
    read_claim,
    record_for,
    record_gone,
    record_idle,
    remove_record,
)
from workers.persona.owners import boot_id, host_name
from workers.persona.write_queue import QUEUE_SUFFIX

__all__ = [
    "NO_LINKS",
    "acquire_claim",
    "break_shared_lock",
    "check_hard_links",
    "enter_waiting_room",
    "queue_for",
    "release_claim",
    "shared_lock_holders",
]

#: What link(2) answers where a filesystem has no hard links.
NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK)
_ROOM_SUFFIX = ".wait"
#: A contended acquisition looks for a dead holder this often.
_DEAD_CHECK_EVERY = 0.5
_FIRST_SLEEP = 0.00005
_MAX_SLEEP = 0.002

_log = structlog.get_logger("soulfleet.locks")


def acquire_claim(claim: str, deadline: float | None, *, may_break: bool) -> bool:
    """Take the shared-mode lock at ``claim`` by ``deadline`` (monotonic; None waits forever).
    False when the deadline passed first. ``may_break``: this caller holds the waiting room,
    so it may remove a claim of a dead process of this machine. Pair a True with
    :func:`release_claim`; call only from the thread holding the path's in-process gate."""
    try:
        if _acquire(claim, deadline, may_break):
            return True
    except BaseException:
        record_idle(claim)
        raise
    record_idle(claim)
    return False


def _acquire(claim: str, deadline: float | None, may_break: bool) -> bool:
    sleep = _FIRST_SLEEP
    next_check = 0.0
    while True:
        record, _ = record_for(claim)
        try:
            os.link(record, claim, follow_symlinks=False)
            return True
        except FileNotFoundError:
            record_gone(claim)  # our record was removed: write a new one
            continue
        except FileExistsError:
            pass
        try:
            # Our record is linked only ever at its claim: a second link is our own link,
            # whose reply was lost (NFS). One stat per look; the claim is read only below.
            if os.stat(record, follow_symlinks=False).st_nlink > 1:
                return True
        except FileNotFoundError:
            record_gone(claim)
            continue
        now = time.monotonic()
        if may_break and now >= next_check:
            next_check = now + _DEAD_CHECK_EVERY
            found = read_claim(claim)
            if found is None or _break_if_dead(claim, *found):
                continue  # released meanwhile, or a dead claim broken: try again now
        if deadline is not None and now >= deadline:
            return False
        waits.sleep(sleep if deadline is None else max(0.0, min(sleep, deadline - now)))
        sleep = min(sleep * 2, _MAX_SLEEP)


def _break_if_dead(claim: str, identity: tuple[int, int], owner: Claim | str) -> bool:
    """Remove ``claim`` if it is the claim read as ``identity`` and its owner is a dead process
    of this machine. Only while holding the waiting room (see the module docstring)."""
    if not isinstance(owner, Claim) or not owner_gone(claim, identity, owner):
        return False
    try:
        now = os.stat(claim, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if (now.st_dev, now.st_ino) != identity:
        return True  # someone else's claim now: look again
    with contextlib.suppress(FileNotFoundError):
        os.unlink(claim)
    remove_record(claim, owner, identity)
    _log.warning(
        "lock.dead_claim_broken",
        lock_file=claim,
        claim=owner.describe(),
        reason="its process no longer runs on this machine",
    )
    return True


def release_claim(claim: str) -> None:
    """Release the lock taken by :func:`acquire_claim`; the owner record stays for next time."""
    try:
        known = known_record(claim)
        try:
            now = os.stat(claim, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if known is not None and now is not None and (now.st_dev, now.st_ino) == known[1]:
            os.unlink(claim)
        else:
            # An operator broke our claim while we held it (break_shared_lock): what is there
            # now, if anything, is someone else's.
            _log.warning("lock.claim_lost", lock_file=claim, found=describe(read_claim(claim)))
    finally:
        record_idle(claim)


def enter_waiting_room(
    claim: str,
    deadline: float | None,
    contended: Callable[[], object] | None = None,
    settled: Callable[[], bool] | None = None,
) -> str | None:
    """Queue this machine's writers of ``claim`` on a flock; the room's path once in, or None
    where flock is missing (ENOLCK, ENOSYS, a symlink), not granted by ``deadline``, or the
    wait was ``settled`` (as :func:`workers.persona.flock.flock_acquire` takes them)."""
    room = f"{claim}{_ROOM_SUFFIX}"
    try:
        return room if flock_acquire(room, deadline, contended, settled) else None
    except OSError:
        return None


def queue_for(claim: str) -> str:
    """Where this machine's writers of ``claim`` queue their writes for this machine's holder:
    one queue per kernel (its boot id; the host name where that is unreadable), since
    ``O_APPEND`` keeps appends whole only within one kernel. Containers on one machine share
    it, as they share the waiting room."""
    kernel = boot_id()
    name = host_name() if kernel is None else f"{kernel:032x}"
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{claim.removesuffix(CLAIM_SUFFIX)}.{digest}{QUEUE_SUFFIX}"


def shared_lock_holders(lock_file: str | os.PathLike[str]) -> tuple[str, ...]:
    """Who holds a shared-mode lock: ``("held claim by pid N on host",)``, or ``()``."""
    found = read_claim(os.fspath(lock_file))
    return () if found is None else (describe(found),)


def break_shared_lock(lock_file: str | os.PathLike[str]) -> tuple[str, ...]:
    """Remove the claim on a shared-mode lock, and its owner's record; returns what was removed.

    For operators, after a holder on another machine crashed mid-write: first make sure the
    process named in :func:`shared_lock_holders` is not running, or two writers may overlap.
    Whatever else blocks the claim path goes too (an empty directory, a symlink, a stray file);
    a directory with files in it is left alone (:class:`PersonaFileError` says so).
    """
    claim = os.fspath(lock_file)
    found = read_claim(claim)
    if found is None:
        return ()
    try:
        if os.path.isdir(claim) and not os.path.islink(claim):
            os.rmdir(claim)  # not ours: only an empty one, whatever put it there
        else:
            os.unlink(claim)
    except FileNotFoundError:
        return ()  # its owner released it meanwhile
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise PersonaFileError(
            claim,
            "is a directory with files in it, not a claim: soulfleet never made it and does not "
            "delete what is inside; look at its contents, move it away, and writes resume",
        ) from None
    owner = found[1]
    if isinstance(owner, Claim):
        remove_record(claim, owner, found[0])
    description = describe(found)
    _log.warning("lock.claim_broken", lock_file=claim, claim=description)
    return (description,)


def check_hard_links(directory: str | os.PathLike[str]) -> str | None:
    """Why shared lock mode cannot work in ``directory`` (its filesystem refuses hard links),
    or None. For start-up, so a worker says so at once, not at its first memory write: a file
    is made, linked and both removed. A directory that cannot be written to is not judged
    (None): each persona's own directory is what writes need."""
    base = os.path.join(directory, f".soulfleet-link-check-{os.getpid()}-{time.monotonic_ns()}")
    try:
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    os.close(fd)
    try:
        os.link(base, f"{base}.link")
    except OSError as error:
        if error.errno in NO_LINKS:
            return (
                f"{os.fspath(directory)} is on a filesystem without hard links "
                f"({error.strerror}), which SOULFLEET_LOCK_MODE=shared needs for its claims"
            )
        return None
    finally:
        for leftover in (base, f"{base}.link"):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
    return None

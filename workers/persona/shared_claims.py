"""Shared lock mode: one claim file per lock, published with a hard link (safe on NFS-like
filesystems, where ``flock`` may not exclude across clients).

The protocol (:mod:`workers.persona.locks` says when to use the mode):

* **A claim is a hard link.** Each process writes, once per lock, a small owner record beside
  the lock (``<claim>.<token>.owner``: pid, host, process start time) and holds the lock while
  that record is also linked at the claim path (``.locks/<file>.claim``). ``link(2)`` fails
  with EEXIST when the name exists, atomically on the server, on NFS too; the record is
  complete before it is published, so a reader never sees half a claim. Acquiring is one
  ``link``, releasing one ``unlink``: filelock's strict claims, used before issue 15, cost
  about 230 system calls per acquisition here.
* **A lost reply is not a lost lock.** An NFS ``link`` that succeeded but whose reply was lost
  answers EEXIST on the retry; our record then has a second link (it is linked nowhere but at
  its claim), which one ``stat`` per look tells.
* **A waiting room.** A host's writers queue on a flock (``<claim>.wait``) first and hold it
  across the write, so this host's contenders meet the claim one at a time and only writers of
  other hosts ever poll it. Where flock is missing (ENOLCK, ENOSYS) the claim alone decides.
* **Dead claims of this host are broken, by one writer at a time.** A writer that finds the
  claim held by a process of this host that is gone (its pid no longer runs, or now belongs to
  a later process) removes it, but only while it holds the waiting room: every writer that may
  break this host's claims waits there, so the claim it judged dead is still the one it
  removes. A claim from another host is never touched (its processes cannot be seen from
  here); it stays until its owner releases it or an operator clears it with
  :func:`break_shared_lock` (``soulfleet status`` names it via :func:`shared_lock_holders`).
  Never by age: age-based expiry could let two live writers overlap.
* **Owner records do not pile up.** A process keeps at most :data:`MAX_RECORDS` records (the
  least recently used idle one is removed first) and removes its records at exit; records of
  this host's dead processes (a SIGKILLed worker) are removed by the next process of the host
  that takes the same lock.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from workers.persona.flock import flock_acquire
from workers.persona.owners import Owner, host_name
from workers.persona.writes import write_all

__all__ = [
    "CLAIM_MAGIC",
    "MAX_RECORDS",
    "OWNER_SUFFIX",
    "Claim",
    "acquire_claim",
    "break_shared_lock",
    "encode_record",
    "enter_waiting_room",
    "queue_for",
    "read_claim",
    "release_claim",
    "shared_lock_holders",
]

CLAIM_MAGIC = "soulfleet-claim-v1"
OWNER_SUFFIX = ".owner"
#: Owner records one process keeps between acquisitions.
MAX_RECORDS = 64
_ROOM_SUFFIX = ".wait"
#: A contended acquisition looks for a dead holder this often.
_DEAD_CHECK_EVERY = 0.5
_FIRST_SLEEP = 0.00005
_MAX_SLEEP = 0.002
_RECORD_LIMIT = 1024
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

_log = structlog.get_logger("soulfleet.locks")

_guard = threading.Lock()
#: claim path -> (owner record path, its (device, inode)); most recently used last.
_records: OrderedDict[str, tuple[str, tuple[int, int]]] = OrderedDict()
#: Claims a thread of this process is acquiring or holding: their records are never evicted.
_busy: set[str] = set()


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds a shared-mode lock, as its owner record says."""

    owner: Owner
    #: The random part of the owner record's name (``<claim>.<token>.owner``).
    token: str

    def describe(self) -> str:
        host = self.owner.host if self.owner.host.isprintable() else repr(self.owner.host)
        return f"held claim by pid {self.owner.pid} on {host}"


def _forget_after_fork() -> None:
    # The parent's records name the parent's pid: a child must write its own (and must not
    # remove the parent's).
    global _guard  # noqa: PLW0603
    _guard = threading.Lock()
    _records.clear()
    _busy.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _remove_records() -> None:
    with _guard:
        for record, _ in _records.values():
            with contextlib.suppress(OSError):
                os.unlink(record)
        _records.clear()


def encode_record(owner: Owner, token: str) -> bytes:
    """An owner record: magic, pid, host (hex), start token, the token of its name."""
    start = "" if owner.start is None else str(owner.start)
    fields = (CLAIM_MAGIC, str(owner.pid), owner.host.encode().hex(), start, token)
    return ("\n".join(fields) + "\n").encode("ascii")


def _decode(data: bytes) -> Claim | None:
    try:
        magic, pid, host, start, token, rest = data.decode("ascii").split("\n")
        owner = Owner(int(pid), bytes.fromhex(host).decode(), int(start) if start else None)
    except ValueError:  # UnicodeDecodeError included
        return None
    if magic != CLAIM_MAGIC or rest or owner.pid < 1 or not token.isalnum():
        return None
    return Claim(owner, token)


def read_claim(claim: str) -> tuple[tuple[int, int], Claim | str] | None:
    """The file at ``claim``: its (device, inode) and its owner, or a sentence saying why it
    names none; None when there is no claim."""
    try:
        fd = os.open(claim, _READ)
    except FileNotFoundError:
        return None
    except OSError as error:  # a symlink or a directory put there: it still blocks the link
        return (0, 0), f"unreadable claim ({error.strerror or error})"
    try:
        found = os.fstat(fd)
        owner = _decode(os.read(fd, _RECORD_LIMIT))
    except OSError as error:  # a directory put there
        return (0, 0), f"unreadable claim ({error.strerror or error})"
    finally:
        os.close(fd)
    identity = (found.st_dev, found.st_ino)
    return identity, owner or "unreadable claim (not a soulfleet owner record)"


def _record_for(claim: str) -> tuple[str, tuple[int, int]]:
    """This process's owner record for ``claim`` (written if needed), marked busy."""
    with _guard:
        known = _records.get(claim)
        if known is not None:
            _records.move_to_end(claim)
            _busy.add(claim)
            return known
    token = secrets.token_hex(8)
    record = f"{claim}.{token}{OWNER_SUFFIX}"
    fd = os.open(record, _CREATE | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        write_all(fd, encode_record(Owner.current(), token))
        found = os.fstat(fd)
    finally:
        os.close(fd)
    known = record, (found.st_dev, found.st_ino)
    _remove_dead_records(claim)
    with _guard:
        _records[claim] = known
        _busy.add(claim)
        idle = [name for name in _records if name not in _busy]
        for name in idle[: max(0, len(_records) - MAX_RECORDS)]:
            with contextlib.suppress(OSError):
                os.unlink(_records.pop(name)[0])
    return known


def _remove_dead_records(claim: str) -> None:
    """Remove the owner records for ``claim`` left by this host's dead processes."""
    directory, name = os.path.split(claim)
    prefix = f"{name}."
    try:
        with os.scandir(directory or ".") as entries:
            stale = [
                entry.path
                for entry in entries
                if entry.name.startswith(prefix) and entry.name.endswith(OWNER_SUFFIX)
            ]
    except OSError:
        return
    for record in stale:
        found = read_claim(record)
        if found is not None and isinstance(found[1], Claim) and found[1].owner.gone_here():
            with contextlib.suppress(OSError):
                os.unlink(record)


def _forget(claim: str) -> None:
    with _guard:
        _records.pop(claim, None)


def _done(claim: str) -> None:
    with _guard:
        _busy.discard(claim)


def acquire_claim(claim: str, deadline: float | None, *, may_break: bool) -> bool:
    """Take the shared-mode lock at ``claim`` by ``deadline`` (monotonic; None waits forever).
    False when the deadline passed first. ``may_break``: this caller holds the waiting room,
    so it may remove a claim of a dead process of this host. Pair a True with
    :func:`release_claim`; call only from the thread holding the path's in-process gate."""
    try:
        if _acquire(claim, deadline, may_break):
            return True
    except BaseException:
        _done(claim)
        raise
    _done(claim)
    return False


def _acquire(claim: str, deadline: float | None, may_break: bool) -> bool:
    sleep = _FIRST_SLEEP
    next_check = 0.0
    while True:
        record, _ = _record_for(claim)
        try:
            os.link(record, claim, follow_symlinks=False)
            return True
        except FileNotFoundError:
            _forget(claim)  # our record was removed: write a new one
            continue
        except FileExistsError:
            pass
        try:
            # Our record is linked only ever at its claim: a second link is our own link,
            # whose reply was lost (NFS). One stat per look; the claim is read only below.
            if os.stat(record, follow_symlinks=False).st_nlink > 1:
                return True
        except FileNotFoundError:
            _forget(claim)
            continue
        now = time.monotonic()
        if may_break and now >= next_check:
            next_check = now + _DEAD_CHECK_EVERY
            found = read_claim(claim)
            if found is None or _break_if_dead(claim, *found):
                continue  # released meanwhile, or a dead claim broken: try again now
        if deadline is not None and now >= deadline:
            return False
        time.sleep(sleep if deadline is None else max(0.0, min(sleep, deadline - now)))
        sleep = min(sleep * 2, _MAX_SLEEP)


def _break_if_dead(claim: str, identity: tuple[int, int], owner: Claim | str) -> bool:
    """Remove ``claim`` if it is the claim read as ``identity`` and its owner is a dead process
    of this host. Only while holding the waiting room (see the module docstring)."""
    if not isinstance(owner, Claim) or not owner.owner.gone_here():
        return False
    try:
        now = os.stat(claim, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if (now.st_dev, now.st_ino) != identity:
        return True  # someone else's claim now: look again
    with contextlib.suppress(FileNotFoundError):
        os.unlink(claim)
    record = f"{claim}.{owner.token}{OWNER_SUFFIX}"
    with contextlib.suppress(OSError):
        if os.stat(record, follow_symlinks=False).st_ino == identity[1]:
            os.unlink(record)
    _log.warning(
        "lock.dead_claim_broken",
        lock_file=claim,
        claim=owner.describe(),
        reason="its process no longer runs on this host",
    )
    return True


def release_claim(claim: str) -> None:
    """Release the lock taken by :func:`acquire_claim`; the owner record stays for next time."""
    try:
        with _guard:
            known = _records.get(claim)
        try:
            now = os.stat(claim, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if known is not None and now is not None and (now.st_dev, now.st_ino) == known[1]:
            os.unlink(claim)
        else:
            # An operator broke our claim while we held it (break_shared_lock): what is there
            # now, if anything, is someone else's.
            _log.warning("lock.claim_lost", lock_file=claim, found=_describe(read_claim(claim)))
    finally:
        _done(claim)


def _describe(found: tuple[tuple[int, int], Claim | str] | None) -> str:
    if found is None:
        return "no claim"
    owner = found[1]
    return owner.describe() if isinstance(owner, Claim) else owner


def enter_waiting_room(
    claim: str,
    deadline: float | None,
    contended: Callable[[], object] | None = None,
    settled: Callable[[], bool] | None = None,
) -> str | None:
    """Queue this host's writers of ``claim`` on a flock; the room's path once in, or None
    where flock is missing (ENOLCK, ENOSYS, a symlink), not granted by ``deadline``, or the
    wait was ``settled`` (as :func:`workers.persona.flock.flock_acquire` takes them)."""
    room = f"{claim}{_ROOM_SUFFIX}"
    try:
        return room if flock_acquire(room, deadline, contended, settled) else None
    except OSError:
        return None


def queue_for(claim: str) -> str:
    """Where this host's writers of ``claim`` queue their writes for this host's holder: one
    queue per host, since ``O_APPEND`` keeps appends whole only within one host's kernel."""
    host = hashlib.sha256(host_name().encode()).hexdigest()[:12]
    return f"{claim.removesuffix('.claim')}.{host}.queue"


def shared_lock_holders(lock_file: str | os.PathLike[str]) -> tuple[str, ...]:
    """Who holds a shared-mode lock: ``("held claim by pid N on host",)``, or ``()``."""
    found = read_claim(os.fspath(lock_file))
    return () if found is None else (_describe(found),)


def break_shared_lock(lock_file: str | os.PathLike[str]) -> tuple[str, ...]:
    """Remove the claim on a shared-mode lock; returns what was removed.

    For operators, after a holder on another host crashed mid-write: first make sure the
    process named in :func:`shared_lock_holders` is not running, or two writers may overlap.
    """
    claim = os.fspath(lock_file)
    found = read_claim(claim)
    if found is None:
        return ()
    try:
        os.unlink(claim)
    except FileNotFoundError:
        return ()  # its owner released it meanwhile
    description = _describe(found)
    _log.warning("lock.claim_broken", lock_file=claim, claim=description)
    return (description,)

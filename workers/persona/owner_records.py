"""Owner records of shared-mode claims: what a claim says about its holder, and the records
each process keeps (:mod:`workers.persona.shared_claims` takes and releases the claims).

* **One record per process and lock, reused.** A process writes a small record beside the
  lock once (``<claim>.<token>.owner``: magic, pid, host, process start token, the token) and
  links it at the claim path for each acquisition: the record is complete before it is
  published, so a reader never sees half a claim, and acquiring is one ``link``.
* **A record is locked while its process lives.** Its process holds a shared ``flock`` on the
  record from writing it until it removes it; the kernel lets go the moment the process dies.
  So whether a claim's owner is gone can be told on its own kernel even from another pid
  namespace (:func:`owner_gone`): a container restarted after a crash keeps its host name but
  gets a new namespace, whose pids say nothing about the old one's. Descriptors are
  ``O_CLOEXEC``, and a forked child closes the ones it inherited (else the parent's records
  would stay locked by the child after the parent died).
* **Records do not pile up.** A process keeps at most :data:`MAX_RECORDS` (the least recently
  used idle one is removed first) and removes its records at exit; a forked child writes its
  own. Records of dead processes of this kernel (a SIGKILLed worker, which runs no exit hooks)
  are removed by the next process of the kernel that writes a record for the same lock.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from workers.persona.owners import Owner, host_name
from workers.persona.writes import write_all

__all__ = [
    "CLAIM_MAGIC",
    "CLAIM_SUFFIX",
    "MAX_RECORDS",
    "OWNER_SUFFIX",
    "Claim",
    "describe",
    "encode_record",
    "known_record",
    "owner_gone",
    "read_claim",
    "record_for",
    "record_gone",
    "record_idle",
    "record_path",
    "remove_record",
]

CLAIM_MAGIC = "soulfleet-claim-v1"
#: The suffix of a shared-mode lock file (a claim: it exists only while a writer holds it).
CLAIM_SUFFIX = ".claim"
OWNER_SUFFIX = ".owner"
#: Owner records one process keeps between acquisitions.
MAX_RECORDS = 64
_RECORD_LIMIT = 1024
# Read-write: NFSv4 turns flock into POSIX locks, which refuse a shared lock on a file
# opened write-only and an exclusive one on a file opened read-only (EBADF).
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_PROBE = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

_guard = threading.Lock()
#: claim path -> our record for it; most recently used last.
_records: OrderedDict[str, _Kept] = OrderedDict()
#: Claims a thread of this process is acquiring or holding: their records are never evicted.
_busy: set[str] = set()


@dataclass(frozen=True, slots=True)
class _Kept:
    """One of this process's owner records: its path, (device, inode) and locked descriptor."""

    path: str
    identity: tuple[int, int]
    fd: int

    def drop(self, *, remove: bool) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


@dataclass(frozen=True, slots=True)
class Claim:
    """Who holds a shared-mode lock, as its owner record says."""

    owner: Owner
    #: The random part of the owner record's name (``<claim>.<token>.owner``).
    token: str
    #: Its owner holds a flock on the record while it lives (where flock works).
    locked: bool = False

    def describe(self) -> str:
        host = self.owner.host if self.owner.host.isprintable() else repr(self.owner.host)
        return f"held claim by pid {self.owner.pid} on {host}"


def _forget_after_fork() -> None:
    # The parent's records name the parent's pid: a child writes its own, never removes the
    # parent's, and closes the inherited descriptors, which would keep them locked.
    global _guard  # noqa: PLW0603
    _guard = threading.Lock()
    for kept in _records.values():
        kept.drop(remove=False)
    _records.clear()
    _busy.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _remove_records() -> None:
    with _guard:
        for kept in _records.values():
            kept.drop(remove=True)
        _records.clear()


def record_path(claim: str, token: str) -> str:
    """Where the owner record named by ``token`` lives, beside ``claim``."""
    return f"{claim}.{token}{OWNER_SUFFIX}"


def remove_record(claim: str, owner: Claim, identity: tuple[int, int]) -> None:
    """Remove the owner record a broken claim was linked to (if it still is that file)."""
    record = record_path(claim, owner.token)
    with contextlib.suppress(OSError):
        if os.stat(record, follow_symlinks=False).st_ino == identity[1]:
            os.unlink(record)


def encode_record(owner: Owner, token: str, *, locked: bool) -> bytes:
    """An owner record: magic, pid, host (hex), start token, the token of its name, and
    whether its owner holds the record's flock ("1") or could not take it ("0")."""
    start = "" if owner.start is None else str(owner.start)
    fields = (CLAIM_MAGIC, str(owner.pid), owner.host.encode().hex(), start, token)
    return ("\n".join((*fields, "1" if locked else "0")) + "\n").encode("ascii")


def _decode(data: bytes) -> Claim | None:
    try:
        magic, pid, host, start, token, locked, rest = data.decode("ascii").split("\n")
        owner = Owner(int(pid), bytes.fromhex(host).decode(), int(start) if start else None)
    except ValueError:  # UnicodeDecodeError included
        return None
    if magic != CLAIM_MAGIC or rest or owner.pid < 1 or not token.isalnum():
        return None
    if locked not in ("0", "1"):
        return None
    return Claim(owner, token, locked == "1")


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


def record_for(claim: str) -> tuple[str, tuple[int, int]]:
    """This process's owner record for ``claim`` (written and locked if needed), marked busy:
    its path and (device, inode)."""
    with _guard:
        known = _records.get(claim)
        if known is not None:
            _records.move_to_end(claim)
            _busy.add(claim)
            return known.path, known.identity
    token = secrets.token_hex(8)
    record = record_path(claim, token)
    fd = os.open(record, _CREATE, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # held until the record is dropped or we die
            locked = True
        except OSError:  # no flock here (ENOLCK): the record says so, and no one relies on it
            locked = False
        write_all(fd, encode_record(Owner.current(), token, locked=locked))
        found = os.fstat(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(record)
        raise
    kept = _Kept(record, (found.st_dev, found.st_ino), fd)
    _remove_dead_records(claim, record)
    with _guard:
        _records[claim] = kept
        _busy.add(claim)
        idle = [name for name in _records if name not in _busy]
        for name in idle[: max(0, len(_records) - MAX_RECORDS)]:
            _records.pop(name).drop(remove=True)
    return kept.path, kept.identity


def owner_gone(path: str, identity: tuple[int, int], claim: Claim) -> bool:  # noqa: PLR0911
    """Whether the process that wrote the record ``claim`` read at ``path`` (as ``identity``)
    is gone, as far as this machine can tell: by pid and start time in our own pid namespace;
    by the record's flock in another namespace of our kernel; by its boot id when this machine
    has rebooted since; never for another machine's process."""
    owner = claim.owner
    if owner.host == host_name():  # our pid namespace: its pid and start time decide
        return owner.gone_here()
    if owner.machine != Owner.current_machine():
        return False
    if owner.before_this_boot():
        return True  # every process of an earlier boot is gone
    if not owner.on_this_kernel() or not claim.locked:
        return False  # its lock cannot tell (no flock where it ran): never guess
    try:
        fd = os.open(path, _PROBE)
    except OSError:
        return False
    try:
        found = os.fstat(fd)
        if (found.st_dev, found.st_ino) != identity:
            return False  # not the record that was judged: look again
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # its owner holds it (or flock fails here: never guess)
    finally:
        os.close(fd)  # also lets go of a lock just taken
    return True


def _remove_dead_records(claim: str, mine: str) -> None:
    """Remove the owner records for ``claim`` left by dead processes of this machine."""
    directory, name = os.path.split(claim)
    prefix = f"{name}."
    try:
        with os.scandir(directory or ".") as entries:
            records = [
                entry.path
                for entry in entries
                if entry.name.startswith(prefix)
                and entry.name.endswith(OWNER_SUFFIX)
                and entry.path != mine
            ]
    except OSError:
        return
    for record in records:
        found = read_claim(record)
        if found is None or not isinstance(found[1], Claim):
            continue
        if owner_gone(record, found[0], found[1]):
            with contextlib.suppress(OSError):
                os.unlink(record)


def known_record(claim: str) -> tuple[str, tuple[int, int]] | None:
    """This process's record for ``claim`` (path, (device, inode)), if it wrote one."""
    with _guard:
        known = _records.get(claim)
    return None if known is None else (known.path, known.identity)


def record_gone(claim: str) -> None:
    """Our record for ``claim`` was removed by someone: write a new one next time."""
    with _guard:
        known = _records.pop(claim, None)
    if known is not None:
        known.drop(remove=False)


def record_idle(claim: str) -> None:
    """No thread of ours is acquiring or holding ``claim``: its record may be evicted."""
    with _guard:
        _busy.discard(claim)


def describe(found: tuple[tuple[int, int], Claim | str] | None) -> str:
    """What :func:`read_claim` found, in words for logs, errors and ``soulfleet status``."""
    if found is None:
        return "no claim"
    owner = found[1]
    return owner.describe() if isinstance(owner, Claim) else owner

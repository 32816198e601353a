"""Whether a persona directory's filesystem can take a turn's files, asked before the model call.

A turn writes its transcript, its session state and its memory edits into the persona's home. On
a full (or over quota) or read-only filesystem, or one refusing the worker's user (EACCES,
EPERM: a wrong owner after a restore, an immutable directory), every such write fails, and it
fails only after the model call has been paid for: left to the commit, each retry would pay for
a reply it could not keep. :func:`check` asks the filesystem first, so a turn that cannot be
saved is refused before it costs anything, as a transient failure (:class:`StorageUnavailable`):
the lane waits with backoff and carries on by itself once space is freed, the mount is writable
or the ownership is fixed again.

- Every turn: one ``statvfs`` of the home (a read-only mount, less than
  :data:`MIN_FREE_BYTES` free to unprivileged writers, or under :data:`MIN_FREE_INODES` free
  inodes).
- A turn whose lane last failed on storage (``probe=True``): also one small file created,
  written and removed in the home, which finds what ``statvfs`` cannot see (a user or project
  quota, a full inode table, a filesystem that says it has room and refuses the write).
"""

from __future__ import annotations

import contextlib
import os
import secrets

from workers.persona.errors import (
    STORAGE_ERRNOS,
    PersonaError,
    SoulfleetError,
    StorageUnavailable,
    causes,
)
from workers.persona.files import confined
from workers.persona.waits import fsync

__all__ = [
    "MIN_FREE_BYTES",
    "MIN_FREE_INODES",
    "PROBE_BYTES",
    "STORAGE_MARK",
    "check",
    "failure_message",
    "storage_error",
]

#: Below this much free space a turn is not started: a reply alone may take 256 KiB
#: (SOULFLEET_REPLY_MAX_BYTES), its transcript and session state as much again.
MIN_FREE_BYTES = 1024 * 1024
#: Below this many free inodes a turn is not started (each creates a file or two; a
#: filesystem that reports no inode count, as some network ones do, is not asked).
MIN_FREE_INODES = 16
#: What the probe writes: one filesystem block, so a full disk or quota refuses it.
PROBE_BYTES = 4096
#: Begins every storage failure's message (the lane's error), so the next attempt knows to
#: probe with a real write.
STORAGE_MARK = "persona storage unavailable"
_PROBE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def check(
    home: str | os.PathLike[str], *, probe: bool = False, within: tuple[str, ...] = ()
) -> None:
    """Raise :class:`StorageUnavailable` when ``home``'s filesystem is read-only or nearly
    full, or (``probe``) refuses a small write in ``home`` or in any of the directories
    ``within`` it that exist (a lane's ``sessions/<lane>`` owned by another user refuses
    writes the home takes). Any other ``OSError`` (the home is gone, say) is left to the turn,
    which reports it as it always did."""
    try:
        info = os.statvfs(home)
    except OSError:
        return
    if info.f_flag & os.ST_RDONLY:
        raise StorageUnavailable(
            home, "its filesystem is mounted read-only (seen before the model call)"
        )
    if info.f_files and info.f_favail < MIN_FREE_INODES:
        raise StorageUnavailable(
            home,
            f"{info.f_favail:,} free inodes on its filesystem, a turn needs {MIN_FREE_INODES} "
            "(seen before the model call)",
        )
    free = info.f_bavail * info.f_frsize
    if free < MIN_FREE_BYTES:
        raise StorageUnavailable(
            home,
            f"{free:,} bytes free on its filesystem, a turn needs {MIN_FREE_BYTES:,} (seen "
            "before the model call)",
        )
    if probe:
        _probe(os.fspath(home))
        for inner in within:
            # Never outside the home (a symlinked sessions/ is the turn's own error to report).
            try:
                path = confined(home, inner)
            except PersonaError:
                continue
            if path.is_dir():
                _probe(os.fspath(path))


def _probe(home: str) -> None:
    # A name of its own (a killed worker's leftover is never in the way); removed at once.
    name = os.path.join(home, f".storage-probe-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(name, _PROBE, 0o600)
    except OSError as exc:
        _refuse(home, exc)
        return
    try:
        os.write(fd, b"\0" * PROBE_BYTES)
        fsync(fd)  # delayed allocation: some filesystems refuse space only here
    except OSError as exc:
        _refuse(home, exc)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


def _refuse(home: str, exc: OSError) -> None:
    if exc.errno in STORAGE_ERRNOS:
        problem = f"a test write was refused before the model call: {exc.strerror}"
        raise StorageUnavailable(home, problem, exc.errno) from exc


def storage_error(exc: BaseException | None) -> OSError | None:
    """The ``OSError`` of a full, read-only or refusing filesystem (:data:`STORAGE_ERRNOS`)
    that ``exc`` is or was caused by."""
    for current in causes(exc, context=True):
        if isinstance(current, SoulfleetError) and type(current).retryable is False:
            # Its class decided (an unreadable SOUL.md is a PersonaFileError, dead-lettered):
            # an EACCES behind it must not be described as storage the lane waits out.
            return None
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return current
    return None


def failure_message(home: str | os.PathLike[str], exc: BaseException, doing: str) -> str | None:
    """The lane's error for a turn that failed ``doing`` something on a full or read-only
    filesystem (naming the file when the error does), or None for any other failure."""
    if isinstance(exc, StorageUnavailable):
        return str(exc)
    error = storage_error(exc)
    if error is None:
        return None
    where = f" ({error.filename})" if error.filename else ""
    problem = f"{error.strerror or error} while {doing}{where}"
    return str(StorageUnavailable(home, problem, error.errno))

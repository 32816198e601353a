"""Durable writes inside a persona directory: atomic replacement, exclusive creation, and the
temp files a crashed writer leaves.

* **Atomic writes.** :func:`atomic_write_bytes` writes a temp file in the same directory, fsyncs
  it, ``os.replace``-s it over the target and fsyncs the directory: a reader sees the old bytes or
  the new bytes, never a mix, and a crash leaves the old file plus at most one hidden
  ``.<name>.<hex>.tmp`` file (removed on every error path we get to run; one a SIGKILL left is
  removed by the next writer holding the path's lock, :func:`remove_stale_temps`).
* **Appends in place.** :func:`append_bytes` for a write that only adds bytes at the end of a
  file it read under its lock (a memory ``add``): one write and one ``fdatasync`` where a
  replace pays a temp file, two flushes and a rename (issue 15). Kept to what stays as safe as
  the replace for the bytes already there: see its docstring.
* **Exclusive creation.** :func:`create_bytes` for a name only its writer uses and nothing reads
  before it is complete: no temp file and no rename.

Paths are written as given: confine them first (:func:`workers.persona.files.confined`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import mmap
import os
import random
import re
import stat
from collections.abc import Callable

from workers.persona.files import file_kind
from workers.persona.filesystems import is_local
from workers.persona.waits import fdatasync, fsync

__all__ = [
    "TEMP_SUFFIX",
    "append_bytes",
    "atomic_write_bytes",
    "atomic_write_text",
    "create_bytes",
    "fsync_directory",
    "fsync_file",
    "open_regular",
    "remove_stale_temps",
    "replace_bytes",
    "single_link",
    "write_all",
    "write_synced",
]

#: Temp files are ``.<target name>.<16 hex>.tmp`` in the target's own directory: hidden, and
#: never matching ``*.md``, so listings of notes never show one.
TEMP_SUFFIX = ".tmp"

_DEFAULT_MODE = 0o644
_TEMP_ATTEMPTS = 4
#: An append stays within one page of the page cache (:func:`append_bytes`).
_PAGE = mmap.PAGESIZE
_APPEND_FLAGS = (  # read too: lines another program appended are checked (_extended)
    os.O_RDWR
    | os.O_APPEND
    | os.O_NONBLOCK
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Flush a directory entry change (a rename, a create) to disk."""
    _fsync_path(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file's data and size to disk (never through a final symlink)."""
    _fsync_path(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)


def _fsync_path(path: str | os.PathLike[str], flags: int) -> None:
    fd = os.open(path, flags)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    before_rename: Callable[[tuple[int, int]], None] | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    The new file keeps the permission bits of the file it replaces (0o644, less the umask, for a
    new one). ``path`` is written as given: confine it first with :func:`confined`.
    ``before_rename`` gets the new file's (inode, size) once its bytes are on disk, just before
    it replaces ``path``: what ``path`` will show once the rename happened.
    """
    replace_bytes(path, data, before_rename=before_rename)
    fsync_directory(os.path.dirname(os.fspath(path)) or ".")


def create_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` durably to ``path``, a file that must not exist yet (a file or a symlink
    already there is ``FileExistsError``: never overwritten, never followed).

    For a name only one writer ever uses, read only once something names it as complete (a
    session state, before the lane's pointer moves to it): no temp file and rename needed, which
    saves a turn a ``stat`` and a ``rename``. A crash mid-write may leave a partial file under
    that name; whatever owns those names collects it. Confine ``path`` first.
    """
    target = os.fspath(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(target, flags | getattr(os, "O_CLOEXEC", 0), _DEFAULT_MODE)
    try:
        write_synced(fd, data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise
    fsync_directory(os.path.dirname(target) or ".")


def replace_bytes(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    before_rename: Callable[[tuple[int, int]], None] | None = None,
) -> None:
    """:func:`atomic_write_bytes` without the final directory fsync: the new bytes are on disk
    (fsynced before the rename, so a crash leaves the old file or the new one, never a mix),
    but the rename itself is durable only after :func:`fsync_directory` of ``path``'s parent.

    For a writer that has more to do between the rename and the directory fsync (the memory
    tool records what it will answer first, :mod:`workers.persona.ledger`).
    """
    target = os.fspath(path)
    directory, name = os.path.split(target)
    try:
        mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for attempt in range(_TEMP_ATTEMPTS):
        # Unique, not secret: O_EXCL refuses a name that exists (and never follows a link), so a
        # pseudo-random name is enough and spares each write a getrandom system call.
        temp = os.path.join(directory, f".{name}.{random.getrandbits(64):016x}{TEMP_SUFFIX}")
        try:
            fd = os.open(temp, flags, _DEFAULT_MODE)
            break
        except FileExistsError:
            if attempt == _TEMP_ATTEMPTS - 1:
                raise
    try:
        inode = os.fstat(fd).st_ino if before_rename is not None else 0
        write_synced(fd, data, mode=mode)
        if before_rename is not None:
            before_rename((inode, len(data)))
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def append_bytes(
    path: str | os.PathLike[str],
    current: bytes | None,
    data: bytes,
    *,
    before_append: Callable[[tuple[int, int]], None] | None = None,
) -> bool:
    """Make ``path`` hold ``data`` by appending to it in place, durably, when that is as safe
    as :func:`replace_bytes`; False (nothing done) when it is not, and the caller replaces.

    ``current`` is what the caller read of ``path`` under the lock every writer of ``path``
    holds; ``data`` must be ``current`` with bytes added at its end. Those bytes are written at
    the end of the file (``O_APPEND``: after whole lines another program appended since the
    read, never over them) and flushed with one ``fdatasync``: the file keeps its
    inode, so the rename of the replace is not needed, nor the directory fsync that makes it
    durable (issue 15: a memory ``add`` paid a temp file, two flushes and a rename). Only when:

    * the file is a regular file with one link, holding ``current`` (or ``current`` and whole
      lines another program appended since): a hard link shared with another file (or persona)
      is replaced, as before, never written through; a file otherwise changed since it was
      read is replaced from what was read, as before;
    * the file is on a filesystem of this machine's own
      (:func:`~workers.persona.filesystems.is_local`): a network filesystem's client keeps an
      unflushed append of a killed process and can write it back after another host wrote
      there;
    * the added bytes stay within one page of the page cache: the kernel copies them in before
      it moves the file's size, so a reader sees the file without them or with all of them, and
      a SIGKILL cannot cut the write short (Linux stops a write between pages, never inside
      one). An append that would cross a page boundary is a replace.

    What it assumes that the replace does not: bytes of the file outside the written range
    survive a power cut during the write (the disk's "powersafe overwrite", which SQLite also
    assumes by default): the last page, which holds acknowledged entries too, is written again
    with the same bytes in them. A power cut before the flush returns may leave a prefix of the
    added bytes (the write was not acknowledged).

    ``before_append`` gets the file's (inode, size) as they will be once the bytes are in,
    before they are written, and again, before the flush, if they ended elsewhere (another
    program appended meanwhile). A failed write or flush is undone (the bytes cut off again,
    unless another program appended after them) and raised; a file another program replaced
    during the write raises ``OSError`` (ESTALE): the bytes went to the file it replaced."""
    if current is None or len(data) <= len(current) or not data.startswith(current):
        return False
    added = data[len(current) :]
    try:
        fd = os.open(os.fspath(path), _APPEND_FLAGS)
    except OSError:
        return False  # the replace says what is wrong, or replaces what is there
    try:
        info = os.fstat(fd)
        start = _start(fd, info, os.fspath(path), current, added)
        if start is None:
            return False
        if before_append is not None:
            before_append((info.st_ino, start + len(added)))
        written = 0
        try:
            # O_APPEND: at the file's end as it is then, so a line another program (a person's
            # `echo >>`) appended since the read is written after, never over.
            written = os.write(fd, added)
            if written != len(added):
                raise OSError(errno.ENOSPC, "No space left on device (a short write)", path)
            end = os.lseek(fd, 0, os.SEEK_CUR)
            if end != start + len(added) and before_append is not None:
                # Another program appended meanwhile, so the bytes ended further on: say so
                # again, or a crash from here would leave an intent that names the wrong size.
                before_append((info.st_ino, end))
            fdatasync(fd)
        except BaseException:
            _undo_append(fd, written)
            raise
        if os.stat(path, follow_symlinks=False).st_ino != info.st_ino:
            # Another program replaced the file meanwhile (an editor's save): the bytes went to
            # the file it replaced, which nobody reads.
            raise OSError(errno.ESTALE, "it was replaced by another program during the write", path)
        return True
    finally:
        os.close(fd)


def _start(fd: int, info: os.stat_result, path: str, current: bytes, added: bytes) -> int | None:
    """Where the append would start, or None when it may not be made in place."""
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        return None
    if not is_local(info.st_dev, path):
        return None  # a network filesystem's client can write a dead append back late
    start = info.st_size
    if start != len(current) and not _extended(fd, current, start):
        return None
    return None if start % _PAGE + len(added) > _PAGE else start


def _extended(fd: int, current: bytes, size: int) -> bool:
    """Whether the file (``size`` bytes) is ``current`` with whole lines another program
    appended since it was read (a person's `echo >>`): the append then goes after them, where
    a replace from what was read would drop them."""
    if not len(current) < size <= len(current) + _PAGE:
        return False
    return os.pread(fd, len(current), 0) == current and os.pread(fd, 1, size - 1) == b"\n"


def _undo_append(fd: int, written: int) -> None:
    """Cut a failed append's bytes off again, if nothing was appended after them."""
    with contextlib.suppress(OSError):
        end = os.lseek(fd, 0, os.SEEK_CUR)
        if written and os.fstat(fd).st_size == end:
            os.ftruncate(fd, end - written)


def open_regular(path: str | os.PathLike[str], flags: int, mode: int = _DEFAULT_MODE) -> int:
    """``os.open(path, flags, mode)`` for a write that must reach a regular file and never
    block: a FIFO at the name with no reader fails at once (``O_NONBLOCK``: ENXIO, where a
    plain open waited for a reader for ever, under whatever lock the writer holds), and one
    that opened anyway (a FIFO with a reader, a device) is closed and refused; never through a
    final symlink, nor into a file with other hard links (:func:`single_link`; ``O_TRUNC`` is
    applied only once that is known). Raises ``OSError`` naming what it found."""
    target = os.fspath(path)
    nofollow = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, (flags & ~os.O_TRUNC) | os.O_NONBLOCK | nofollow, mode)
    except OSError as error:
        if error.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "not a regular file (a FIFO or a socket)", target) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(
                errno.EINVAL, f"not a regular file (it is {file_kind(info.st_mode)})", target
            )
        single_link(info, target)
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def single_link(info: os.stat_result, path: str | os.PathLike[str]) -> None:
    """Refuse to write in place into a file that has other names: a hard link planted in a
    persona's directory may name a file outside it, which the write would change too.
    (Replacing a file, as :func:`replace_bytes` does, breaks such a link instead.)"""
    if info.st_nlink > 1:
        raise OSError(
            errno.EMLINK,
            f"has {info.st_nlink} hard links: written in place, every other name of it (maybe "
            "outside the persona, a `cp -al` snapshot) would change too; give it a name of its "
            "own: `cp -p FILE FILE.own && mv FILE.own FILE`",
            os.fspath(path),
        )


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (``os.write`` may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_synced(fd: int, data: bytes, *, mode: int | None = None) -> None:
    """All of ``data`` to ``fd`` (with ``mode`` first, when given), fsynced; closes ``fd``."""
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        write_all(fd, data)
        fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temps(path: str | os.PathLike[str]) -> list[str]:
    """Delete the temp files crashed writers of ``path`` left (``.<name>.<16 hex>.tmp``).

    Call it ONLY while holding ``path``'s write lock: every writer of ``path`` writes under that
    lock, so any temp file of ``path`` found then belongs to a writer that died mid-write (a
    SIGKILL skips the cleanup :func:`atomic_write_bytes` does on every error path it can run).
    Returns the names removed; one it may not remove (EPERM) is left, never an error.
    """
    directory, name = os.path.split(os.fspath(path))
    pattern = _temp_pattern(name)
    removed: list[str] = []
    try:
        with os.scandir(directory or ".") as entries:
            stale = [
                e for e in entries if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)
            ]
    except OSError:
        return removed
    for entry in stale:
        # One this writer may not remove (another user's, in a sticky directory) is left: a
        # leftover must never stop the write itself.
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.unlink(entry.path)
            removed.append(entry.name)
    return removed


@functools.lru_cache(maxsize=256)
def _temp_pattern(name: str) -> re.Pattern[str]:
    """What :func:`atomic_write_bytes` names the temp files of ``name``."""
    return re.compile(rf"\.{re.escape(name)}\.[0-9a-f]{{16}}{re.escape(TEMP_SUFFIX)}")


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))

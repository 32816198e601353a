"""Safe file access inside a persona directory: confined paths, bounded reads, atomic writes.

Why this module exists: a persona directory is edited by people, by the fleet and by the model
(through the memory tool), possibly from several hosts over a shared filesystem. Three rules keep
that safe, and every file the persona core writes goes through them:

* **Confinement.** :func:`confined` turns a relative name into a real path and refuses anything
  that resolves outside the persona root: ``..`` traversal, absolute names, and symlinks (at any
  component) that lead outside. A symlink that stays inside the root is followed, and the
  returned path is its real target, so a write replaces the real file (not the link) and two
  names for one file share one lock.
* **Bounded reads.** :func:`read_prefix` reads at most ``limit + 1`` bytes, so a runaway file can
  never cost more memory than the cap it is checked against, and refuses anything that is not a
  regular file (a directory, a FIFO that would block, a dangling link) with an error naming it.
* **Atomic writes.** :func:`atomic_write_bytes` writes a temp file in the same directory, fsyncs
  it, ``os.replace``-s it over the target and fsyncs the directory: a reader sees the old bytes or
  the new bytes, never a mix, and a crash leaves the old file plus at most one hidden
  ``.<name>.<hex>.tmp`` file (removed on every error path we get to run).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path, PurePath

from workers.persona.errors import PersonaFileError

__all__ = [
    "TEMP_SUFFIX",
    "atomic_write_bytes",
    "atomic_write_text",
    "confined",
    "fsync_directory",
    "read_prefix",
]

#: Temp files are ``.<target name>.<16 hex>.tmp`` in the target's own directory: hidden, and
#: never matching ``*.md``, so listings of notes never show one.
TEMP_SUFFIX = ".tmp"

_DEFAULT_MODE = 0o644


def confined(root: str | os.PathLike[str], relative: str | os.PathLike[str]) -> Path:
    """The real path of ``root/relative``, refusing anything that leaves ``root``.

    ``relative`` must be a relative path without ``..`` components. Symlinks are resolved; the
    result must lie inside the resolved root, otherwise :class:`PersonaFileError` names the path
    and where it leads. The returned path need not exist yet.
    """
    real_root = Path(root).resolve()
    rel = PurePath(relative)
    if rel.is_absolute() or str(rel) in ("", "."):
        raise PersonaFileError(relative, "must be a relative path inside the persona directory")
    if ".." in rel.parts:
        raise PersonaFileError(
            relative, "'..' is not allowed: paths must stay inside the persona directory"
        )
    candidate = real_root / rel
    real = candidate.resolve()
    if real == real_root or not real.is_relative_to(real_root):
        raise PersonaFileError(
            candidate,
            f"resolves to {real}, outside the persona directory {real_root} (a symlink leads out); "
            "soulfleet never writes outside a persona's own directory",
        )
    return real


def read_prefix(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """Up to ``limit + 1`` bytes of a regular file; ``None`` if nothing exists at ``path``.

    Reading one byte past ``limit`` lets the caller tell "exactly at the cap" from "over it"
    without ever reading a whole runaway file. Anything that exists but is not a readable regular
    file raises :class:`PersonaFileError` naming the path.
    """
    target = Path(path)
    try:
        info = target.stat()
    except FileNotFoundError:
        if target.is_symlink():
            problem = f"is a symlink to a missing file ({os.readlink(target)})"
            raise PersonaFileError(target, problem) from None
        return None
    except OSError as error:
        raise PersonaFileError(target, f"cannot be inspected: {error.strerror or error}") from None
    if stat.S_ISDIR(info.st_mode):
        raise PersonaFileError(target, "is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise PersonaFileError(target, "is not a regular file")
    try:
        with target.open("rb") as handle:
            return handle.read(limit + 1)
    except FileNotFoundError:
        return None  # removed between stat and open: as good as absent
    except OSError as error:
        raise PersonaFileError(target, f"cannot be read: {error.strerror or error}") from None


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Flush a directory entry change (a rename, a create) to disk."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    The new file keeps the permission bits of the file it replaces (0o644, less the umask, for a
    new one). ``path`` is written as given: confine it first with :func:`confined`.
    """
    target = Path(path)
    directory = target.parent
    temp = directory / f".{target.name}.{secrets.token_hex(8)}{TEMP_SUFFIX}"
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temp, flags, _DEFAULT_MODE)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    fsync_directory(directory)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))

"""Safe file access inside a persona directory: confined paths and bounded reads.

Why this module exists: a persona directory is edited by people, by the fleet and by the model
(through the memory tool), possibly from several hosts over a shared filesystem. Three rules keep
that safe, and every file the persona core reads or writes goes through them:

* **Confinement.** :func:`confined` turns a relative name into a real path and refuses anything
  that resolves outside the persona root: ``..`` traversal, absolute names, and symlinks (at any
  component) that lead outside. A symlink that stays inside the root is followed, and the
  returned path is its real target, so a write replaces the real file (not the link) and two
  names for one file share one lock.
* **Bounded, non-blocking reads.** :func:`read_prefix` is the one door every persona file is read
  through: it opens without blocking (``O_NONBLOCK``), checks the opened descriptor is a regular
  file (a FIFO would block a reader forever, ``/dev/zero`` would never end) and reads at most
  ``limit + 1`` bytes, so no file can hang a worker thread or the beat loop, or cost more memory
  than the cap it is checked against.
* **Links kept in bounds.** :func:`read_inside` reads a persona's own files (persona.toml, the
  bootstrap files, HEARTBEAT.md, DREAM.md), whose text goes to the model: a symlink among them
  may lead to a file inside the persona directory, never out of it.
* **Durable writes** live beside them in :mod:`workers.persona.writes`.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

from workers.persona.errors import PersonaFileError, PersonaNotFound

__all__ = [
    "ROOT_CACHE_SECONDS",
    "confined",
    "file_kind",
    "make_dirs",
    "persona_file_problem",
    "read_inside",
    "read_prefix",
    "real_root",
    "regular_file_problem",
]

_READ_CHUNK = 1 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_READ_NOFOLLOW_FLAGS = _READ_FLAGS | getattr(os, "O_NOFOLLOW", 0)


def confined(root: str | os.PathLike[str], relative: str | os.PathLike[str]) -> Path:
    """The real path of ``root/relative``, refusing anything that leaves ``root``.

    ``relative`` must be a relative path without ``..`` components. Symlinks are resolved; the
    result must lie inside the resolved root, otherwise :class:`PersonaFileError` names the path
    and where it leads. The returned path need not exist yet.

    Cost (a turn calls this a few times): the root's real path comes from a cache kept for
    ``ROOT_CACHE_SECONDS`` (see :func:`real_root`), and only the components of ``relative`` are
    checked, one ``lstat`` each, on every call: a symlink anywhere below the root is seen the
    moment it appears, and sends the call down the full ``realpath`` check.
    """
    rel = os.fspath(relative)
    parts = [part for part in rel.split("/") if part and part != "."]
    if rel.startswith("/") or not parts:
        raise PersonaFileError(relative, "must be a relative path inside the persona directory")
    if ".." in parts:
        raise PersonaFileError(
            relative, "'..' is not allowed: paths must stay inside the persona directory"
        )
    base = real_root(root)
    prefix = base if base == "/" else base + "/"
    path = prefix + "/".join(parts)
    walked = base
    for part in parts:
        walked = walked + "/" + part if walked != "/" else "/" + part
        try:
            mode = os.lstat(walked).st_mode
        except OSError:
            break  # absent from here on: nothing below can be a symlink yet
        if stat.S_ISLNK(mode):
            real = os.path.realpath(path)
            if not _inside(real, base):
                raise PersonaFileError(
                    Path(path),
                    f"resolves to {real}, outside the persona directory {base} (a symlink leads "
                    "out); soulfleet never writes outside a persona's own directory",
                )
            return Path(real)
    return Path(path)


def _inside(path: str, base: str) -> bool:
    """Whether the real path ``path`` lies below the real directory ``base`` (not ``base``
    itself): the one test of confinement, for writes and reads alike."""
    return path != base and path.startswith(base.rstrip("/") + "/")


def make_dirs(root: str | os.PathLike[str], directory: str | os.PathLike[str]) -> Path:
    """Create ``directory`` (inside ``root``) and its missing parents, never ``root`` itself.

    ``mkdir(parents=True)`` brought a persona directory renamed or deleted mid-turn back as an
    empty stub holding only the turn's ``sessions/`` or ``transcripts/`` (``status`` then listed
    it, ``post`` accepted items for it). Here a missing ``root`` is :class:`PersonaNotFound`.
    """
    base = Path(real_root(root))
    target = Path(directory)
    try:
        relative = target.relative_to(base)
    except ValueError:
        raise PersonaFileError(target, f"is outside the persona directory {base}") from None
    if not relative.parts:  # the root itself: never made here
        return target
    try:  # the common case, one system call: it exists already, or only it is missing
        os.mkdir(target)
    except FileExistsError:
        return target
    except FileNotFoundError:
        pass
    else:
        return target
    current = base
    for part in relative.parts:
        current = current / part
        try:
            os.mkdir(current)
        except FileExistsError:
            continue
        except FileNotFoundError:
            if not os.path.isdir(root):
                raise PersonaNotFound(root, "it was moved or deleted") from None
            raise
    return target


#: How long :func:`real_root` trusts a root's resolved path (see there).
ROOT_CACHE_SECONDS = 1.0
_ROOTS_MAX = 4096
_roots: dict[str, tuple[str, float]] = {}


def real_root(root: str | os.PathLike[str]) -> str:
    """``os.path.realpath(root)``, cached per process for ``ROOT_CACHE_SECONDS``.

    Resolving costs an ``lstat`` per component of the root's path, and every turn confines
    several names to the same persona root. The root is where confinement starts (the fleet's
    configured persona directory), not something a persona's files can change; re-pointing a
    root that is itself a symlink takes effect within ``ROOT_CACHE_SECONDS``, while the files
    below a root are checked on every call. Thread-safe: a dict lookup and an assignment, each
    atomic, and a stale or racing entry only ever holds a real path the root had.
    """
    key = os.fspath(root)
    if not key.startswith("/"):
        return os.path.realpath(key)  # relative to a working directory that may change
    now = time.monotonic()
    cached = _roots.get(key)
    if cached is not None and now - cached[1] < ROOT_CACHE_SECONDS:
        return cached[0]
    real = os.path.realpath(key)
    if len(_roots) >= _ROOTS_MAX:
        _roots.clear()
    _roots[key] = (real, now)
    return real


def file_kind(mode: int) -> str:
    """A file type in words, for errors that say why a path was refused."""
    for test, words in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def regular_file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not usable as a persona file, from ``stat`` alone (never opens it);
    None when it is a regular file or absent. For checks that must not even open a file."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a symlink to a missing file ({os.readlink(path)})"
        return None
    except OSError as error:
        return f"cannot be inspected: {error.strerror or error}"
    if stat.S_ISREG(info.st_mode):
        return None
    return _not_regular(info.st_mode)


def _check_opened_within(fd: int, target: str, within: str) -> None:
    """Refuse the opened ``fd`` unless the file it is lies in ``within``: a directory on the
    way to ``target`` swapped for a link after the path was checked leads the open elsewhere."""
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the path was checked just before the open
        return
    if not _inside(opened, within):
        raise PersonaFileError(
            Path(target), f"opened as {opened}, outside {within} (a link was swapped in)"
        )


def _not_regular(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    return f"is not a regular file (it is {file_kind(mode)}); persona files must be regular files"


def read_inside(home: str | os.PathLike[str], name: str, limit: int) -> bytes | None:
    """:func:`read_prefix` of the file ``name`` in the persona directory ``home`` (persona.toml, a
    bootstrap file, HEARTBEAT.md, DREAM.md), where a symlink is followed only to a file inside
    the persona directory itself.

    Whatever these files hold goes into the soul sent to the model provider and into the
    persona's session files, so a link to ``/proc/self/environ``, ``~/.env`` or another
    persona's memory would hand the worker's secrets or another persona's data to the model: it
    is refused with :class:`PersonaFileError` naming the file and where it leads (a file shared
    by several personas is a hard link or a copy). Costs nothing for a file that is not a link:
    it is opened with ``O_NOFOLLOW``; only a link is resolved and checked, and the descriptor
    its target opens as is checked again (``/proc/self/fd``), so a link swapped in anywhere on
    the way after the check is refused, never read.
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"read_inside takes a file name, got {name!r}")
    base = real_root(home)
    named = os.path.join(base, name)
    try:
        return read_prefix(named, limit, follow_symlinks=False)
    except PersonaFileError:
        if not os.path.islink(named):
            raise
    target = os.path.realpath(named)
    outside = _link_out(base, target)
    if outside is not None:
        raise PersonaFileError(Path(named), outside)
    try:
        data = read_prefix(target, limit, follow_symlinks=False, within=base)
    except PersonaFileError as error:  # named as the persona file people know
        raise PersonaFileError(
            Path(named), f"is a symlink to {target}, which {error.problem}"
        ) from None
    if data is None:
        missing = f"is a symlink to a missing file ({os.readlink(named)})"
        raise PersonaFileError(Path(named), missing)
    return data


def _link_out(base: str, target: str) -> str | None:
    """Why a link in the persona directory ``base`` to the real path ``target`` is refused (it
    leads out of ``base``), or None."""
    if _inside(target, base):
        return None
    return (
        f"is a symlink to {target}, outside the persona directory {base}: what a persona file "
        "holds is sent to the model, so it must lie in the persona directory; put the file "
        "itself there (a hard link or a copy shares one file between personas)"
    )


def persona_file_problem(home: str | os.PathLike[str], name: str) -> str | None:
    """Why the file ``name`` in the persona directory ``home`` cannot be read by
    :func:`read_inside`, from ``lstat``/``stat`` alone (never opens it): not a regular file
    (:func:`regular_file_problem`), or a symlink leading out. None when it is fine or absent."""
    base = real_root(home)
    named = os.path.join(base, name)
    problem = regular_file_problem(named)
    if problem is None and os.path.islink(named):
        problem = _link_out(base, os.path.realpath(named))
    return problem


def read_prefix(
    path: str | os.PathLike[str],
    limit: int,
    *,
    follow_symlinks: bool = True,
    within: str | None = None,
) -> bytes | None:
    """Up to ``limit + 1`` bytes of a regular file; ``None`` if nothing exists at ``path``.

    THE one way the persona core and beat read a persona's files (persona.toml, bootstrap files,
    DREAM.md, HEARTBEAT.md, notes, transcripts), because a person can put anything at those
    names. The file is opened with ``O_NONBLOCK`` (a FIFO cannot block the open) and, unless
    ``follow_symlinks``, ``O_NOFOLLOW``; the OPENED descriptor is then checked with ``fstat``
    (no race with a swap after a ``stat``), so a FIFO, a device such as ``/dev/zero``, a socket
    or a directory is refused with :class:`PersonaFileError` naming the path and what it is,
    before one byte is read. Reading one byte past ``limit`` lets the caller tell "exactly at
    the cap" from "over it" without ever reading a whole runaway file. ``within``: the opened
    file must lie in that directory (checked on the descriptor, see :func:`read_inside`).
    """
    target = os.fspath(path)
    try:
        fd = os.open(target, _READ_FLAGS if follow_symlinks else _READ_NOFOLLOW_FLAGS)
    except FileNotFoundError:
        if os.path.islink(target):
            problem = f"is a symlink to a missing file ({os.readlink(target)})"
            raise PersonaFileError(Path(target), problem) from None
        return None
    except OSError as error:
        if error.errno == errno.ELOOP and not follow_symlinks:
            raise PersonaFileError(
                Path(target), "is a symlink; it must be a regular file"
            ) from None
        if error.errno == errno.ENXIO:  # a socket, or a device with nothing behind it
            raise PersonaFileError(Path(target), _not_regular(stat.S_IFSOCK)) from None
        raise PersonaFileError(Path(target), f"cannot be read: {error.strerror or error}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PersonaFileError(Path(target), _not_regular(info.st_mode))
        if within is not None:
            _check_opened_within(fd, target, within)
        wanted = limit + 1
        # The size is only a hint (the file may grow or shrink meanwhile), but asking for one
        # byte more than it lets a file that is not growing be read in one call: a short read
        # of a regular file is its end. os.read allocates what it is asked for, so asking for
        # the whole cap would cost a 1 MiB buffer per small file.
        ask = min(wanted, info.st_size + 1, _READ_CHUNK)
        first = os.read(fd, ask)
        if len(first) < ask:
            return first
        chunks = [first]
        wanted -= len(first)
        while wanted > 0:
            chunk = os.read(fd, min(wanted, _READ_CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            wanted -= len(chunk)
        return b"".join(chunks)
    except OSError as error:
        raise PersonaFileError(Path(target), f"cannot be read: {error.strerror or error}") from None
    finally:
        os.close(fd)

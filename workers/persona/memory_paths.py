"""Where a memory write goes: its data, lock and ledger paths, resolved once and re-checked.

Why (issue 15): resolving a write target in full (the persona directory, then
:func:`~workers.persona.files.confined` for the data file, its lock and its ledger, creating
the lock directory) took about 48 ``stat`` calls per ``add``. A tool now resolves each target
once and, on later calls, re-checks only what could make that answer wrong, with a few
``stat``/``lstat`` calls:

* the persona directory path still names the same directory (same device and inode), and the
  resolved root does too (a directory moved away and recreated is resolved afresh);
* every directory under the root on the way (``.locks``, ``memory``, ``.locks/memory``) is
  still a real directory, not a symlink, and none of the files (data, lock, ledger) became a
  symlink (absent is fine: a write creates them).

A target is cached only when no symlink was followed to reach it (each path is its literal
name under the root), so those checks prove it is still what ``confined`` would return.
Anything else (a symlink inside the persona, a check that fails, a missing ``.locks``) takes
the full resolution again, with its errors.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePath

from workers.persona.files import confined
from workers.persona.home import persona_home
from workers.persona.ledger import LEDGER_SUFFIX
from workers.persona.locks import LOCK_DIR, LockMode, ledger_file_for, lock_file_for, lock_name_for
from workers.persona.memory_spec import NOTES_DIR, MemoryRequest
from workers.persona.shared_claims import queue_for
from workers.persona.write_queue import QUEUE_SUFFIX

__all__ = ["TargetCache", "WriteTarget"]

#: Resolved targets one tool keeps (MEMORY.md, USER.md and the notes it last wrote).
_MAX_CACHED = 64


@dataclass(frozen=True, slots=True)
class WriteTarget:
    """One write target's real paths, and what must stay true for them to still be real."""

    root: Path
    identity: tuple[int, int]
    #: The data, lock and ledger files: plain strings, since every write passes them to os.
    data: str
    #: ``data`` relative to ``root``, for logs.
    relative: str
    #: The directory ``data`` lives in (fsynced after each write).
    directory: str
    lock: str
    ledger: str
    #: Where writers that find the lock taken queue their writes (in shared mode, this host's).
    queue: str
    #: Directories that must still be directories (never symlinks) at these very paths.
    dirs: tuple[str, ...]
    #: Files that must not have become symlinks (absent is fine: a write creates them).
    files: tuple[str, ...]


class TargetCache:
    """The write targets one memory tool resolved, re-checked on every use."""

    def __init__(self) -> None:
        self._known: dict[str, WriteTarget] = {}

    def locate(self, path: Path, request: MemoryRequest, lock_mode: LockMode) -> WriteTarget | None:
        """The target of ``request`` in the persona at ``path``; None for a replace/remove of a
        file that does not exist. Raises what the full resolution raises (PersonaError)."""
        known = self._known.get(request.relative)
        if known is not None and _still_valid(path, known):
            if request.action != "add" and not os.path.lexists(known.data):
                return None
            return known
        root = persona_home(path)
        if request.target.startswith("note:") and request.action == "add":
            confined(root, NOTES_DIR).mkdir(exist_ok=True)
        data = confined(root, request.relative)
        if request.action != "add" and not data.exists():
            # Nothing to find in a file that is not there: answer without creating a lock file.
            return None
        lock = lock_file_for(root, data, lock_mode)
        ledger_file = ledger_file_for(root, data)
        target = WriteTarget(
            root, _identity(os.stat(root)), str(data), str(data.relative_to(root)),
            str(data.parent), str(lock),
            str(ledger_file),
            _queue_for(lock, lock_mode),
            dirs=tuple(str(root / d) for d in _parents(request.relative)),
            files=(str(data), str(lock), str(ledger_file)),
        )  # fmt: skip
        literal = (
            data == root / request.relative
            and lock == root / lock_name_for(request.relative, lock_mode)
            and ledger_file == root / LOCK_DIR / f"{request.relative}{LEDGER_SUFFIX}"
        )
        if literal:
            if len(self._known) >= _MAX_CACHED:
                self._known.clear()
            self._known[request.relative] = target
        return target


def _queue_for(lock: Path, lock_mode: LockMode) -> str:
    if lock_mode == "shared":
        return queue_for(str(lock))  # one per machine: O_APPEND is not whole across NFS clients
    return str(lock)[: -len(lock.suffix)] + QUEUE_SUFFIX


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _parents(relative: str) -> list[str]:
    """The directories under the root a target's data and lock files live in."""
    parent = PurePath(relative).parent
    found = [LOCK_DIR]
    if str(parent) != ".":
        found += [str(parent), str(PurePath(LOCK_DIR) / parent)]
    return found


def _still_valid(path: Path, known: WriteTarget) -> bool:
    """Whether ``known`` is still what the full resolution would give, from a few stat calls."""
    try:
        if _identity(os.stat(path)) != known.identity:
            return False
        if known.root != path and _identity(os.stat(known.root)) != known.identity:
            return False
        for directory in known.dirs:
            if not stat.S_ISDIR(os.lstat(directory).st_mode):
                return False
        for name in known.files:
            try:
                if stat.S_ISLNK(os.lstat(name).st_mode):
                    return False
            except FileNotFoundError:
                continue
    except OSError:
        return False
    return True

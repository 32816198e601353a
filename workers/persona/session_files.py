"""Session states on disk, under ``<home>/sessions/<lane>/``, and the library's pointer file.

Layout::

    <home>/sessions/<lane>/<session id>.<tag>.json    one complete committed state each
    <home>/sessions/<lane>/CURRENT                     the library's pointer {state, epoch}

Why a whole state per file, never edited in place: a turn writes the state it WOULD commit to
a file whose name nobody else uses (the tag is the fleet's fencing token, ``f<fence>``, or a
random ``l<hex>`` for the in-process library), and only then is it made current by moving a
pointer. A turn that crashes, fails or is fenced out before that leaves an orphan file that no
reader ever looks at, so the session holds only committed turns and a retry starts from the
same state (issue 11 rule 6). Compaction keeps a state bounded (``max_tokens``), so rewriting
it per turn is bounded too. Old files are collected after a commit (:meth:`collect`; the fleet's
:meth:`retire` skips the directory listing when no start came between two commits).

The pointer is where the two runtimes differ. The fleet keeps it in the lane's Redis hash and
moves it inside ``finish.lua``, the same fenced step that commits the turn. The library keeps
it in ``CURRENT`` (:class:`FilePointer`), moved under a file lock with compare-and-set, so two
processes running one persona at once lose a turn's session write rather than interleave.
The two are separate sessions of one lane (their GC leaves each other's files alone).

Safety: lane names are the transcripts' slugs; the directory is confined to the home (a
symlink leading out is refused); a state is created under its own name and fsynced, its
directory entry with it, before any pointer names it, and ``CURRENT`` is replaced atomically
(temp file, fsync, rename).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import uuid
from pathlib import Path

import structlog

from workers.persona.errors import PersonaFileError, StorageUnavailable
from workers.persona.files import confined, make_dirs, read_prefix, real_root
from workers.persona.locks import LockMode, lock_file_for, path_lock
from workers.persona.session import Pointer, SessionState
from workers.persona.transcripts import valid_transcript_name
from workers.persona.writes import atomic_write_bytes, create_bytes

__all__ = [
    "MAX_STATE_BYTES",
    "POINTER_NAME",
    "RETIRE_LIST_EVERY",
    "SESSIONS_DIR",
    "FilePointer",
    "SessionFiles",
    "current_session",
    "library_tag",
]

SESSIONS_DIR = "sessions"
#: The most of one state file a reader takes in; compaction keeps states far below it.
MAX_STATE_BYTES = 64 * 1024 * 1024
POINTER_NAME = "CURRENT"
_STATE = re.compile(r"([A-Za-z0-9_][A-Za-z0-9._-]*)\.([fl][0-9a-z]+)\.json")

#: Read errors that say nothing about the file (a disk or network filesystem hiccup, a process
#: out of descriptors or memory): the session is not given up for them, the turn retries.
_PASSING_READ_ERRORS = frozenset({
    errno.EIO, errno.ESTALE, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN,
    errno.EINTR, errno.ETIMEDOUT,
})  # fmt: skip

#: :meth:`SessionFiles.retire` lists the lane's directory at least once in this many fences.
RETIRE_LIST_EVERY = 64

_log = structlog.get_logger("soulfleet.session")


def _fleet_fence(name: str) -> int | None:
    """The fence in a fleet state's name (``<id>.f<fence>.json``); None for any other name."""
    match = _STATE.fullmatch(name)
    if match is None or not match.group(2).startswith("f"):
        return None
    digits = match.group(2)[1:]
    return int(digits) if digits.isdigit() else None


def library_tag() -> str:
    return f"l{uuid.uuid4().hex[:16]}"


class SessionFiles:
    """The state files of one lane of one persona home."""

    def __init__(self, home: str | os.PathLike[str], lane: str) -> None:
        if not valid_transcript_name(lane):
            raise ValueError(f"invalid lane name {lane!r}")
        self.home = Path(real_root(home))
        self.lane = lane

    @property
    def directory(self) -> Path:
        """The lane's directory, confined to the home (created on first write)."""
        return confined(self.home, f"{SESSIONS_DIR}/{self.lane}")

    def has_fleet_states(self, *, before: float) -> bool:
        """Whether a fleet state file written before ``before`` (epoch s: when the lane's
        Redis state was created) is kept here: a lane whose pointer is unset but has one lost
        its Redis state (Redis lost its data, or evicted the lane's hash), not a first turn.
        A state written since is this lane's own uncommitted one (a commit Redis refused),
        which says nothing of a loss. One listing, of a directory a first turn has not got."""
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    if _fleet_fence(entry.name) is None:
                        continue
                    with contextlib.suppress(OSError):  # collected meanwhile: the next one
                        if entry.stat(follow_symlinks=False).st_mtime < before:
                            return True
        except (OSError, PersonaFileError):
            pass
        return False

    def write(self, state: SessionState, tag: str) -> str:
        """Store ``state`` durably under a name only this writer uses; returns that name."""
        name = f"{state.id}.{tag}.json"
        if _STATE.fullmatch(name) is None:
            raise ValueError(f"invalid session state name {name!r}")
        data = state.to_json()
        target = confined(self.home, f"{SESSIONS_DIR}/{self.lane}/{name}")
        # Created in place, not replaced: no one reads a state until a pointer names it, and
        # only this writer uses its name (a partial file a crash leaves is collected later).
        try:
            create_bytes(target, data)
        except FileNotFoundError:  # the lane's first state: make its directory, once
            make_dirs(self.home, self.directory)
            create_bytes(confined(self.home, f"{SESSIONS_DIR}/{self.lane}/{name}"), data)
        return name

    def read(self, name: str | None) -> SessionState | None:
        """The state stored as ``name``; None (with a warning) when it is missing or unreadable,
        which a turn treats as "no session": it starts a new one instead of failing forever.
        A read error that says nothing about the file (EIO, ESTALE, out of descriptors...)
        raises :class:`StorageUnavailable` instead: the turn retries, the session is kept."""
        if not name:
            return None
        if _STATE.fullmatch(name) is None:
            _log.warning("session.bad_pointer", lane=self.lane, state=name)
            return None
        try:
            path = confined(self.home, f"{SESSIONS_DIR}/{self.lane}/{name}")
            # Through the one door: a FIFO under a state's name is refused, never blocked on.
            raw = read_prefix(path, MAX_STATE_BYTES)
            if raw is None:
                _log.warning("session.state_missing", lane=self.lane, state=name)
                return None
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
            return SessionState.from_json(raw)
        except OSError as exc:
            if exc.errno in _PASSING_READ_ERRORS:
                # The file may be intact: starting a new session would move the pointer off
                # it for good. The turn fails instead and its retry reads it again.
                raise StorageUnavailable(
                    self.home, f"reading the session state {name} failed: {exc}"
                ) from exc
            _log.warning("session.state_unreadable", lane=self.lane, state=name, error=str(exc))
        except (PersonaFileError, ValueError) as exc:
            _log.warning("session.state_unreadable", lane=self.lane, state=name, error=str(exc))
        return None

    def discard(self, name: str) -> None:
        """Delete one state file that was never made current (a lost commit)."""
        if _STATE.fullmatch(name) is None:
            return
        with contextlib.suppress(FileNotFoundError, PersonaFileError):
            os.unlink(confined(self.home, f"{SESSIONS_DIR}/{self.lane}/{name}"))

    def retire(self, current: str, previous: str | None) -> int:
        """After the fleet committed ``current`` over ``previous``: delete the fleet's state
        files other than those two (``previous`` stays for a reader that took the pointer just
        before the commit), as :meth:`collect` does; returns how many went.

        Only a start that did not commit leaves a state file no pointer names, and the fence
        only moves by a start (or the reaper taking a lapsed turn back). So when ``previous``
        is the state of the fence just before ``current``'s, nothing came between them, and
        the one file to delete is the state ``previous`` was committed over: when that was the
        fence before it in the same session, it goes by name and the turn is spared listing
        the directory. Every other case (a gap: a failed or fenced-out start, a silent beat,
        a reset; a new session; a guess that finds nothing) lists the directory. Files a
        commit could not clean up (a crash between the commit and this call, an ``OSError``
        here, a lane whose Redis state was lost and whose fences started again) are left to
        the listing every ``RETIRE_LIST_EVERY``-th fence: at most that many commits later.
        """
        fence = _fleet_fence(current)
        if (
            fence is not None
            and fence % RETIRE_LIST_EVERY != 0
            and previous is not None
            and _fleet_fence(previous) == fence - 1
        ):
            guess = f"{previous.split('.', 1)[0]}.f{fence - 2}.json"
            with contextlib.suppress(FileNotFoundError, NotADirectoryError, PersonaFileError):
                os.unlink(confined(self.home, f"{SESSIONS_DIR}/{self.lane}/{guess}"))
                return 1
        return self.collect({current, previous or ""}, tag_prefix="f", committed=current)

    def collect(self, keep: set[str], *, tag_prefix: str, committed: str = "") -> int:
        """Delete this runtime's (``tag_prefix``: "f" fleet, "l" library) state files except
        ``keep``; returns how many went. Never touches the other runtime's files.

        ``committed``: the state this caller just made current. A file written since is
        spared: the next turn (already running elsewhere once the commit queued it) or another
        process may have written and even committed it while this cleanup ran late. A fleet
        state of a fence up to the committed one is never that, whenever it was written."""
        removed = 0
        try:
            directory = self.directory
            entries = list(os.scandir(directory))
            newest = os.stat(os.path.join(directory, committed)).st_mtime_ns if committed else None
        except (FileNotFoundError, NotADirectoryError, PersonaFileError):
            return 0
        ceiling = _fleet_fence(committed) if committed else None
        for entry in entries:
            match = _STATE.fullmatch(entry.name)
            if match is None or entry.name in keep or not match.group(2).startswith(tag_prefix):
                continue
            with contextlib.suppress(FileNotFoundError):
                fence = _fleet_fence(entry.name)
                older_fence = ceiling is not None and fence is not None and fence <= ceiling
                if newest is not None and not older_fence and entry.stat().st_mtime_ns >= newest:
                    continue
                os.unlink(entry.path)
                removed += 1
        return removed


class FilePointer:
    """The library's pointer: ``CURRENT`` holds ``{"state": name, "epoch": n}``."""

    def __init__(
        self, files: SessionFiles, *, lock_mode: LockMode = "local", lock_timeout: float = 10.0
    ) -> None:
        self.files = files
        self.lock_mode: LockMode = lock_mode
        self.lock_timeout = lock_timeout

    def _path(self) -> Path:
        return confined(self.files.home, f"{SESSIONS_DIR}/{self.files.lane}/{POINTER_NAME}")

    def read(self) -> Pointer:
        try:
            data = json.loads(self._path().read_bytes())
            state = data.get("state")
            return Pointer(state if isinstance(state, str) and state else None, int(data["epoch"]))
        except FileNotFoundError:
            return Pointer()
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            _log.warning("session.pointer_unreadable", lane=self.files.lane, error=str(exc))
            return Pointer()

    def _write(self, pointer: Pointer) -> None:
        make_dirs(self.files.home, self.files.directory)
        data = {"state": pointer.state, "epoch": pointer.epoch}
        atomic_write_bytes(self._path(), (json.dumps(data) + "\n").encode())

    def _locked(self) -> contextlib.AbstractContextManager[bool]:
        make_dirs(self.files.home, self.files.directory)
        lock = lock_file_for(self.files.home, self._path(), self.lock_mode)
        return path_lock(lock, mode=self.lock_mode, timeout=self.lock_timeout)

    def commit(self, base: Pointer, state: str) -> bool:
        """Make ``state`` current if the pointer is still ``base`` (nobody committed or reset
        since the turn read it); False, changing nothing, otherwise."""
        with self._locked():
            if self.read() != base:
                return False
            self._write(Pointer(state, base.epoch))
            return True

    def reset(self) -> int:
        """End the current session: the next turn starts a new one. Returns the new epoch."""
        with self._locked():
            current = self.read()
            self._write(Pointer(current.state, current.epoch + 1))
            return current.epoch + 1


def current_session(home: str | os.PathLike[str], lane: str) -> SessionState | None:
    """The library's current session of ``lane`` (None: none yet, or it was reset)."""
    files = SessionFiles(home, lane)
    pointer = FilePointer(files).read()
    state = files.read(pointer.state)
    return state if state is not None and state.epoch == pointer.epoch else None

"""Appending one conversation's messages to its JSON Lines file, durably.

Why append-only JSON Lines with an fsync: a crash loses at most the line being written, and
readers never need a lock. A file is created by the FIRST append (a turn that writes nothing
leaves nothing), after the lane's oldest files are pruned to make room; its first line is a
header::

    {"transcript": 1, "conversation": "<id>", "lane": "<lane>", "started_at": 1700000000.0}
    {"at": 1700000001.25, "message": {"role": "user", "content": "..."}}

Files are opened with ``O_NOFOLLOW`` and must be regular files. A resumed conversation (the same
id opened again after a crash) first terminates a torn last line so the next record starts on a
line of its own.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Protocol

import structlog

from workers.persona.clock import Clock
from workers.persona.errors import PersonaFileError
from workers.persona.files import file_kind
from workers.persona.messages import Message
from workers.persona.transcript_layout import FORMAT_VERSION, ConversationInfo
from workers.persona.waits import fsync
from workers.persona.writes import fsync_directory, single_link, write_all

__all__ = ["ConversationWriter", "LaneFiles"]

log = structlog.get_logger("soulfleet.transcripts")


class LaneFiles(Protocol):
    """What a writer needs from its store when it creates its file."""

    def prune(self, lane: str, *, keep_room_for: str) -> None:
        """Make room in ``lane`` for one more conversation (``keep_room_for`` is kept)."""
        ...

    def make_lane_dir(self, lane: str) -> Path:
        """Create ``lane``'s directory (confined to the home) and return it."""
        ...

    def created(self, path: Path) -> None:
        """Record the store's own new file in the cached listing."""
        ...


def _line(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class ConversationWriter:
    """Appends one conversation's messages; each append is flushed and fsynced before return."""

    def __init__(
        self,
        store: LaneFiles,
        info: ConversationInfo,
        path: Path,
        clock: Clock,
        *,
        sync_each: bool = True,
    ) -> None:
        self._store = store
        self._info = info
        self._path = path
        self._clock = clock
        self._checked_tail = False
        self._sync_each = sync_each
        # Deferred mode (sync_each=False): the file stays open between appends and what was
        # written is fsynced by sync(); the new file's directory entry too.
        self._fd: int | None = None
        self._dirty = False
        self._new_entry = False

    @property
    def info(self) -> ConversationInfo:
        return self._info

    @property
    def path(self) -> Path:
        return self._path

    def append(self, message: Message) -> None:
        """Write ``message`` durably (creating the file, and pruning the lane, on first use).

        Returns None so it can be handed straight to the turn loop as ``on_message``.
        """
        line = _line({"at": self._clock.time(), "message": message.to_dict()})
        if self._fd is not None:
            write_all(self._fd, line)
            self._dirty = True
            return
        # Read and write: a resumed conversation's torn-tail check reads its last byte through
        # the same descriptor (no second open).
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self._path, flags | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            self._create(line)
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                problem = f"is {file_kind(info.st_mode)}, not a transcript file"
                raise PersonaFileError(self._path, problem)
            single_link(info, self._path)
            if not self._checked_tail:
                self._terminate_torn_tail(fd, info.st_size)
            write_all(fd, line)
            if self._sync_each:
                fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        if self._sync_each:
            os.close(fd)
        else:
            self._fd, self._dirty = fd, True

    def sync(self) -> None:
        """Make every append so far durable (deferred mode; a no-op when nothing is pending).

        Appends are written to the file at once either way, so a killed process loses nothing
        it appended; what sync adds is surviving a machine crash. One fsync per turn instead of
        one per message.
        """
        if self._fd is not None and self._dirty:
            fsync(self._fd)
            self._dirty = False
        if self._new_entry:
            fsync_directory(self._path.parent)
            self._new_entry = False

    def close(self) -> None:
        """Release the file (deferred mode). Does not sync: call :meth:`sync` first for that."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _create(self, first: bytes) -> None:
        self._store.prune(self._info.lane, keep_room_for=self._info.id)
        header = _line(
            {
                "transcript": FORMAT_VERSION,
                "conversation": self._info.id,
                "lane": self._info.lane,
                "started_at": self._info.started_at,
            }
        )
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        flags |= getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._path, flags, 0o644)
        except FileNotFoundError:  # the lane directory was removed since open()
            self._store.make_lane_dir(self._info.lane)
            fd = os.open(self._path, flags, 0o644)
        self._store.created(self._path)
        self._checked_tail = True
        try:
            write_all(fd, header + first)
            if self._sync_each:
                fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        if not self._sync_each:
            self._fd, self._dirty, self._new_entry = fd, True, True
            return
        os.close(fd)
        # The new directory entry must survive a crash too, not just the bytes.
        fsync_directory(self._path.parent)

    def _terminate_torn_tail(self, fd: int, size: int) -> None:
        # A crash mid-write may have left a last line without its newline; appending straight
        # after it would glue our record onto the torn one and lose both.
        self._checked_tail = True
        if size == 0:
            return
        if os.pread(fd, 1, size - 1) != b"\n":
            write_all(fd, b"\n")
            log.warning("transcript.torn_tail_terminated", path=str(self._path))

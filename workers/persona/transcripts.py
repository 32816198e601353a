"""Durable per-lane transcripts under ``<home>/transcripts/<lane>/``, one JSON Lines file each.

Why files in the persona's home: the directory IS the agent. A person can read what a persona
said with ``less``, back it up with the rest of the persona, and the dreamer folds it into
memory with no database in the way. Why JSON Lines, append-only, fsync per message: a crash
loses at most the line being written, and readers never need a lock.

Layout::

    <home>/transcripts/<lane>/<started_ms>-<conversation_id>.jsonl

``started_ms`` is the conversation's start time in epoch milliseconds, zero-padded to 15 digits,
so a plain ``ls`` (and this module) orders a lane's conversations oldest first without opening
a file. A file is created by the FIRST append (a turn that writes nothing leaves nothing);
its first line is a header and every further line one message::

    {"transcript": 1, "conversation": "<id>", "lane": "<lane>", "started_at": 1700000000.0}
    {"at": 1700000001.25, "message": {"role": "user", "content": "..."}}

Growth bound: each lane keeps at most ``max_conversations`` files (default 1000,
``SOULFLEET_TRANSCRIPT_MAX_CONVERSATIONS`` in the fleet). Creating a conversation's file
first prunes that lane's oldest files beyond the bound: they leave the lane's listing at once
(``conversations()`` no longer returns them; a store that read one before may still read it
until it is gone) and are unlinked moments later by a background thread
(:mod:`workers.persona.reaper`), because freeing a file's blocks cost a lane's 1,000th turn
1-2.5 ms more than its first. So for those moments the directory
holds one file more than the bound; a process killed before the thread ran leaves such files
behind, and the next creation in that lane (whatever process makes it) counts them on disk and
prunes them. :func:`wait_pruned` waits for the thread. One file is one turn, and a turn is
bounded by its budget, so a persona's transcripts are bounded too.

Safety: lane names and conversation ids are slugs (letters, digits, ``.``, ``_``, ``-``; no
separators, no ``..``), lane directories are confined to the home (``files.confined``: a
symlink leading out is refused, before anything is created), and files are opened with
``O_NOFOLLOW``: nothing is ever written outside ``<home>/transcripts/``. A torn
or malformed line (a crash mid-write, a hand edit) is skipped with a structured warning; it
never crashes a reader. A resumed conversation (the same id opened again after a crash) first
terminates a torn last line so the next record starts on a line of its own.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import structlog

from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import PersonaFileError, PersonaNotFound
from workers.persona.files import confined, file_kind, fsync_directory, read_prefix, real_root
from workers.persona.messages import Message
from workers.persona.reaper import Reaper

__all__ = [
    "MAX_TRANSCRIPT_BYTES",
    "TRANSCRIPTS_DIR",
    "ConversationInfo",
    "ConversationWriter",
    "FileTranscripts",
    "TranscriptRecord",
    "TranscriptStore",
    "valid_transcript_name",
    "wait_pruned",
]

TRANSCRIPTS_DIR = "transcripts"
_SUFFIX = ".jsonl"
_STAMP_DIGITS = 15
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_FORMAT_VERSION = 1
#: The most of one conversation file a reader takes in. A turn is bounded by its budget and
#: each reply by SOULFLEET_REPLY_MAX_BYTES, so only a hand-grown file gets near it.
MAX_TRANSCRIPT_BYTES = 64 * 1024 * 1024

log = structlog.get_logger("soulfleet.transcripts")


def valid_transcript_name(name: object) -> bool:
    """Whether ``name`` may be a lane name or a conversation id (one safe path segment)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None and ".." not in name


def _require_name(kind: str, name: object) -> str:
    if not valid_transcript_name(name):
        raise ValueError(
            f"invalid {kind} {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter, digit or '_', without '..'"
        )
    assert isinstance(name, str)
    return name


@dataclass(frozen=True)
class ConversationInfo:
    """One conversation (one turn) of one lane; ``started_at`` is epoch seconds (ms precision)."""

    id: str
    lane: str
    started_at: float


@dataclass(frozen=True)
class TranscriptRecord:
    """One message of a conversation, with the time it was recorded."""

    conversation: str
    at: float
    message: Message


@runtime_checkable
class TranscriptStore(Protocol):
    """What the dreamer's ``transcript_search`` reads: conversations and their messages."""

    def conversations(self) -> Sequence[ConversationInfo]:
        """Every conversation, oldest first."""
        ...

    def messages(self, conversation_id: str) -> Sequence[TranscriptRecord]:
        """A conversation's messages in order; empty when it does not exist (or was pruned)."""
        ...


def _file_name(info: ConversationInfo) -> str:
    return f"{round(info.started_at * 1000):0{_STAMP_DIGITS}d}-{info.id}{_SUFFIX}"


def _parse_file_name(lane: str, name: str) -> ConversationInfo | None:
    if not name.endswith(_SUFFIX) or len(name) <= _STAMP_DIGITS + 1 + len(_SUFFIX):
        return None
    stamp, dash, rest = name[:_STAMP_DIGITS], name[_STAMP_DIGITS], name[_STAMP_DIGITS + 1 :]
    conversation = rest.removesuffix(_SUFFIX)
    if not stamp.isdigit() or dash != "-" or not valid_transcript_name(conversation):
        return None
    return ConversationInfo(id=conversation, lane=lane, started_at=int(stamp) / 1000)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _line(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class ConversationWriter:
    """Appends one conversation's messages; each append is flushed and fsynced before return."""

    def __init__(
        self,
        store: FileTranscripts,
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
            _write_all(self._fd, line)
            self._dirty = True
            return
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(self._path, flags | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            self._create(line)
            return
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise PersonaFileError(self._path, f"is {file_kind(mode)}, not a transcript file")
            if not self._checked_tail:
                self._terminate_torn_tail(fd)
            _write_all(fd, line)
            if self._sync_each:
                os.fsync(fd)
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
            os.fsync(self._fd)
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
        self._store._prune(self._info.lane, keep_room_for=self._info.id)
        header = _line(
            {
                "transcript": _FORMAT_VERSION,
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
            self._store._make_lane_dir(self._info.lane)
            fd = os.open(self._path, flags, 0o644)
        self._store._created(self._path)
        self._checked_tail = True
        try:
            _write_all(fd, header + first)
            if self._sync_each:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        if not self._sync_each:
            self._fd, self._dirty, self._new_entry = fd, True, True
            return
        os.close(fd)
        # The new directory entry must survive a crash too, not just the bytes.
        fsync_directory(self._path.parent)

    def _terminate_torn_tail(self, fd: int) -> None:
        # A crash mid-write may have left a last line without its newline; appending straight
        # after it would glue our record onto the torn one and lose both.
        self._checked_tail = True
        size = os.fstat(fd).st_size
        if size == 0:
            return
        reader = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            last = os.pread(reader, 1, size - 1)
        finally:
            os.close(reader)
        if last != b"\n":
            _write_all(fd, b"\n")
            log.warning("transcript.torn_tail_terminated", path=str(self._path))


class _Listing:
    """One lane directory's ``*.jsonl`` files: by name, by conversation id, and oldest first."""

    def __init__(self, lane: str, paths: dict[str, str]) -> None:
        self.lane = lane
        self.paths = paths
        self.ids: dict[str, str] = {}
        self.order: list[str] = sorted(name for name in paths if self._index(name))

    def _index(self, name: str) -> bool:
        info = _parse_file_name(self.lane, name)
        if info is None:
            return False
        self.ids[info.id] = name
        return True

    def add(self, name: str, path: str) -> None:
        self.paths[name] = path
        if self._index(name):
            # A new conversation is normally the newest: appending keeps the order sorted.
            if self.order and name < self.order[-1]:
                bisect.insort(self.order, name)
            else:
                self.order.append(name)

    def remove(self, name: str) -> None:
        self.paths.pop(name, None)
        info = _parse_file_name(self.lane, name)
        if info is not None and self.ids.get(info.id) == name:
            del self.ids[info.id]
            index = bisect.bisect_left(self.order, name)
            if index < len(self.order) and self.order[index] == name:
                del self.order[index]


class _Listings:
    """Lane directory listings shared by every store of the process, keyed by directory mtime.

    A lane holds up to ``max_conversations`` files and every turn needs its listing twice (to
    resume a conversation, to prune the oldest): listing and parsing 1,000 names made a lane's
    1,000th turn cost twice its first. A listing (indexed by id, kept oldest first) is reused
    while the directory's ``(st_mtime_ns, st_ino)`` is what it was when we listed it or last
    changed it ourselves, so any other writer's change (another process, a person) is seen on
    the next turn. The one blind spot: directory times are as coarse as the kernel's clock tick
    (1-4 ms), so a foreign change in the same tick as one of ours goes unseen until the
    directory changes again. Only the lane's one running turn writes there, so the worst case
    is a file pruned a turn late.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int], _Listing]] = {}

    @staticmethod
    def _version(directory: str) -> tuple[int, int] | None:
        try:
            st = os.stat(directory)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_mtime_ns, st.st_ino)

    def listing(self, directory: str, lane: str) -> _Listing | None:
        """The lane's listing (shared: read it under :meth:`locked`), None if it has no dir."""
        version = self._version(directory)
        if version is None:
            with self._lock:
                self._cache.pop(directory, None)
            return None
        with self._lock:
            cached = self._cache.get(directory)
            if cached is not None and cached[0] == version:
                return cached[1]
        try:
            with os.scandir(directory) as entries:
                found = {
                    e.name: e.path
                    for e in entries
                    if e.name.endswith(_SUFFIX)
                    and e.path not in _REAPER  # pruned, its unlink still queued
                    and e.is_file(follow_symlinks=False)
                }
        except (FileNotFoundError, NotADirectoryError):
            return None
        listing = _Listing(lane, found)
        with self._lock:
            if len(self._cache) >= _LISTINGS_MAX and directory not in self._cache:
                self._cache.pop(next(iter(self._cache)))
            self._cache[directory] = (version, listing)
        return listing

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def _changed(self, directory: str, change: Callable[[_Listing], object]) -> None:
        with self._lock:
            cached = self._cache.get(directory)
            if cached is None:
                return
            change(cached[1])
            version = self._version(directory)
            if version is None:
                self._cache.pop(directory, None)
            else:
                self._cache[directory] = (version, cached[1])

    def forget(self, directory: str) -> None:
        """Drop a listing we can no longer vouch for: the next use lists the directory."""
        with self._lock:
            self._cache.pop(directory, None)

    def added(self, directory: str, name: str, path: str) -> None:
        self._changed(directory, lambda listing: listing.add(name, path))

    def removed(self, directory: str, name: str) -> None:
        self._changed(directory, lambda listing: listing.remove(name))


_LISTINGS_MAX = 4096
_LISTINGS = _Listings()


def _reaped(path: str, ok: bool) -> None:
    directory, name = os.path.split(path)
    if ok:
        # Our own change to the directory: move the listing's version past it (the file left
        # the listing when it was queued), so the next turn does not list the lane again.
        _LISTINGS.removed(directory, name)
    else:
        _LISTINGS.forget(directory)  # still on disk: count it again


_REAPER = Reaper("soulfleet-transcript-pruner", on_done=_reaped)


def wait_pruned(timeout: float | None = None) -> bool:
    """Block until every pruned file this process queued is off the disk (tests, shutdown);
    False if ``timeout`` ran out first."""
    return _REAPER.wait(timeout)


class FileTranscripts:
    """The durable :class:`TranscriptStore` over ``<home>/transcripts/`` (layout: module doc).

    ``lanes`` scopes the store: it reads (and writes) only those lanes. ``None`` means every lane
    under the directory.
    """

    def __init__(
        self,
        home: str | os.PathLike[str],
        *,
        lanes: Sequence[str] | None = None,
        max_conversations: int = 1000,
        clock: Clock | None = None,
    ) -> None:
        try:
            is_dir = stat.S_ISDIR(os.stat(home).st_mode)
        except (OSError, ValueError):
            is_dir = False
        if not is_dir:
            raise PersonaNotFound(Path(home))
        if isinstance(max_conversations, bool) or max_conversations < 1:
            raise ValueError(f"max_conversations must be at least 1, got {max_conversations!r}")
        self._home = Path(real_root(home))
        self._root = self._home / TRANSCRIPTS_DIR
        self._lanes = None if lanes is None else tuple(_require_name("lane", n) for n in lanes)
        self._max = max_conversations
        self._clock: Clock = clock or SystemClock()
        # id -> file, filled by listings; verified before use, so pruning can never fool it.
        self._paths: dict[str, str] = {}
        self._dirs: dict[str, Path] = {}

    @property
    def root(self) -> Path:
        return self._root

    @property
    def max_conversations(self) -> int:
        return self._max

    def open(
        self, lane: str, conversation_id: str, *, sync_each: bool = True
    ) -> ConversationWriter:
        """A writer for ``conversation_id`` in ``lane``; resumes it if its file already exists.

        ``sync_each=False`` defers fsync to :meth:`ConversationWriter.sync` (the fleet syncs
        once per turn, before the turn commits) and keeps the file open until ``close``.

        Raises ValueError for an invalid lane or id, a lane outside this store's scope, or an id
        already used by another lane (ids name conversations store-wide); PersonaFileError when
        the lane directory would resolve outside ``<home>/transcripts`` (a symlink leading out).
        """
        lane = _require_name("lane", lane)
        conversation_id = _require_name("conversation id", conversation_id)
        if self._lanes is not None and lane not in self._lanes:
            raise ValueError(f"lane {lane!r} is outside this store's lanes {list(self._lanes)}")
        lane_dir = self._confined(lane)
        if not os.path.isdir(lane_dir):  # one stat, where mkdir(exist_ok) costs a failed mkdir
            lane_dir = self._make_lane_dir(lane)
        found = self._find(conversation_id)
        if found is not None:
            info, existing = found
            if info.lane != lane:
                raise ValueError(
                    f"conversation id {conversation_id!r} is already used in lane {info.lane!r}"
                )
            return ConversationWriter(self, info, Path(existing), self._clock, sync_each=sync_each)
        started = round(self._clock.time() * 1000) / 1000
        info = ConversationInfo(id=conversation_id, lane=lane, started_at=started)
        path = lane_dir / _file_name(info)
        self._paths[conversation_id] = str(path)
        return ConversationWriter(self, info, path, self._clock, sync_each=sync_each)

    def conversations(self) -> list[ConversationInfo]:
        """Every conversation in scope, oldest first (ties: lane, then id)."""
        infos: list[ConversationInfo] = []
        for lane in self._lane_names():
            for name, path in self._files(lane):
                info = _parse_file_name(lane, name)
                if info is not None:
                    self._paths[info.id] = path
                    infos.append(info)
        infos.sort(key=lambda info: (info.started_at, info.lane, info.id))
        return infos

    def messages(self, conversation_id: str) -> list[TranscriptRecord]:
        """The conversation's readable messages in order; ``[]`` if it does not exist."""
        conversation_id = _require_name("conversation id", conversation_id)
        path = self._paths.get(conversation_id)
        if path is None or not os.path.isfile(path):
            found = self._find(conversation_id)
            if found is None:
                return []
            path = found[1]
        return list(self._read(conversation_id, path))

    # -- internals -------------------------------------------------------------------------
    # Listings work on plain name strings: a lane holds up to max_conversations files and is
    # listed on every open(), so building a Path per entry would dominate a turn's overhead.

    def _make_lane_dir(self, lane: str) -> Path:
        # Confined again right before creating anything: a symlinked transcripts/ or lane
        # directory leading out of the home would otherwise make even the mkdir land outside.
        self._dirs.pop(lane, None)
        lane_dir = self._confined(lane)
        lane_dir.mkdir(parents=True, exist_ok=True)
        return lane_dir

    def _confined(self, lane: str) -> Path:
        found = self._dirs.get(lane)
        if found is None:
            found = self._dirs[lane] = confined(self._home, f"{TRANSCRIPTS_DIR}/{lane}")
        return found

    def _created(self, path: Path) -> None:
        """Our own new file: add it to the cached listing instead of listing the lane again."""
        _LISTINGS.added(str(path.parent), path.name, str(path))

    def _lane_names(self) -> list[str]:
        if self._lanes is not None:
            return list(self._lanes)
        try:
            with os.scandir(self._root) as entries:
                return sorted(
                    e.name for e in entries if valid_transcript_name(e.name) and e.is_dir()
                )
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _listing(self, lane: str) -> _Listing | None:
        try:
            lane_dir = self._confined(lane)
        except PersonaFileError as exc:
            log.warning("transcript.lane_refused", lane=lane, error=str(exc))
            return None
        return _LISTINGS.listing(str(lane_dir), lane)

    def _files(self, lane: str) -> list[tuple[str, str]]:
        """(name, path) of the lane's regular ``*.jsonl`` files; [] for a missing/refused lane."""
        listing = self._listing(lane)
        if listing is None:
            return []
        with _LISTINGS.lock:
            return list(listing.paths.items())

    def _find(self, conversation_id: str) -> tuple[ConversationInfo, str] | None:
        for lane in self._lane_names():
            listing = self._listing(lane)
            if listing is None:
                continue
            with _LISTINGS.lock:
                name = listing.ids.get(conversation_id)
                path = listing.paths.get(name) if name is not None else None
            if name is not None and path is not None:
                info = _parse_file_name(lane, name)
                if info is not None:
                    self._paths[conversation_id] = path
                    return info, path
        return None

    def _prune(self, lane: str, *, keep_room_for: str) -> None:
        """Drop the lane's oldest files so that one more still fits within the bound: out of
        the listing now, off the disk on the reaper's thread (module doc, "Growth bound")."""
        listing = self._listing(lane)
        if listing is None:
            return
        with _LISTINGS.lock:
            keep = listing.ids.get(keep_room_for)
            count = len(listing.order) - (1 if keep is not None else 0)
            excess = count - (self._max - 1)
            oldest = [name for name in listing.order[: max(0, excess) + 1] if name != keep]
            victims = [(name, listing.paths[name]) for name in oldest[: max(0, excess)]]
        if not victims:
            return
        # Queued before they leave the listing, so a re-listing meanwhile leaves them out too.
        _REAPER.delete(path for _, path in victims)
        for name, path in victims:
            _LISTINGS.removed(os.path.dirname(path), name)
            info = _parse_file_name(lane, name)
            if info is not None:
                self._paths.pop(info.id, None)
                log.debug("transcript.pruned", lane=lane, conversation=info.id, bound=self._max)

    def _read(self, conversation_id: str, path: str) -> Iterator[TranscriptRecord]:
        try:
            raw = read_prefix(path, MAX_TRANSCRIPT_BYTES, follow_symlinks=False)
        except PersonaFileError as exc:
            log.warning("transcript.unreadable", path=str(path), error=exc.problem)
            return
        if raw is None:
            return  # pruned since it was listed
        if len(raw) > MAX_TRANSCRIPT_BYTES:
            # Keep the whole lines within the cap; the cut one would only parse as torn.
            raw = raw[: raw.rfind(b"\n", 0, MAX_TRANSCRIPT_BYTES) + 1]
            log.warning("transcript.truncated", path=str(path), cap_bytes=MAX_TRANSCRIPT_BYTES)
        for number, chunk in enumerate(raw.split(b"\n"), start=1):
            if not chunk.strip():
                continue
            record = self._parse_line(conversation_id, path, number, chunk)
            if record is not None:
                yield record

    def _parse_line(
        self, conversation_id: str, path: str, number: int, chunk: bytes
    ) -> TranscriptRecord | None:
        try:
            data = json.loads(chunk.decode("utf-8", errors="replace"))
        except ValueError:
            log.warning("transcript.torn_line", path=str(path), line=number, bytes=len(chunk))
            return None
        if isinstance(data, dict) and "transcript" in data and "message" not in data:
            return None  # the header
        try:
            if not isinstance(data, dict):
                raise TypeError("a record must be a JSON object")
            at = data["at"]
            if isinstance(at, bool) or not isinstance(at, int | float):
                raise TypeError("'at' must be a number")
            return TranscriptRecord(conversation_id, float(at), Message.from_dict(data["message"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("transcript.bad_record", path=str(path), line=number, error=str(exc))
            return None

"""Durable per-lane transcripts under ``<home>/transcripts/<lane>/``, one JSON Lines file each.

Why files in the persona's home: the directory IS the agent. A person can read what a persona
said with ``less``, back it up with the rest of the persona, and the dreamer folds it into
memory with no database in the way. Why JSON Lines, append-only, fsync per message: a crash
loses at most the line being written, and readers never need a lock.

The rooms: :mod:`~workers.persona.transcript_layout` (paths, names, records),
:mod:`~workers.persona.transcript_writer` (appending durably) and
:mod:`~workers.persona.transcript_listings` (cached lane listings, the pruner thread); this
module is the store over them::

    <home>/transcripts/<lane>/<started_ms>-<conversation_id>.jsonl

Growth bound: each lane keeps at most ``max_conversations`` files (default 1000,
``SOULFLEET_TRANSCRIPT_MAX_CONVERSATIONS`` in the fleet). Creating a conversation's file
first prunes that lane's oldest files beyond the bound (of the oldest by start, plus
:data:`PRUNE_SPARE_SCAN` more, the least recently written: a session still going on is spared
for newer one-shot runs in its lane): they leave the lane's listing at once
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
never crashes a reader.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import structlog

from workers.persona import transcript_listings
from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import PersonaFileError, PersonaNotFound
from workers.persona.files import confined, make_dirs, real_root
from workers.persona.transcript_layout import (
    MAX_TRANSCRIPT_BYTES,
    TRANSCRIPTS_DIR,
    ConversationInfo,
    TranscriptRecord,
    file_name,
    parse_file_name,
    read_records,
    require_name,
    valid_transcript_name,
)
from workers.persona.transcript_listings import Listing, wait_pruned
from workers.persona.transcript_writer import ConversationWriter

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

log = structlog.get_logger("soulfleet.transcripts")

#: How many conversations beyond the ones a prune drops it looks at, to spare the oldest that
#: are still being written (each costs a ``stat``; the live ones among the oldest are few).
PRUNE_SPARE_SCAN = 8


@runtime_checkable
class TranscriptStore(Protocol):
    """What the dreamer's ``transcript_search`` reads: conversations and their messages."""

    def conversations(self) -> Sequence[ConversationInfo]:
        """Every conversation, oldest first."""
        ...

    def messages(self, conversation_id: str) -> Sequence[TranscriptRecord]:
        """A conversation's messages in order; empty when it does not exist (or was pruned)."""
        ...


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
        self._lanes = None if lanes is None else tuple(require_name("lane", n) for n in lanes)
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
        lane = require_name("lane", lane)
        conversation_id = require_name("conversation id", conversation_id)
        if self._lanes is not None and lane not in self._lanes:
            raise ValueError(f"lane {lane!r} is outside this store's lanes {list(self._lanes)}")
        lane_dir = self._confined(lane)
        if not os.path.isdir(lane_dir):  # one stat, where mkdir(exist_ok) costs a failed mkdir
            lane_dir = self.make_lane_dir(lane)
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
        path = lane_dir / file_name(info)
        self._paths[conversation_id] = str(path)
        return ConversationWriter(self, info, path, self._clock, sync_each=sync_each)

    def conversations(self) -> list[ConversationInfo]:
        """Every conversation in scope, oldest first (ties: lane, then id)."""
        infos: list[ConversationInfo] = []
        for lane in self._lane_names():
            for name, path in self._files(lane):
                info = parse_file_name(lane, name)
                if info is not None:
                    self._paths[info.id] = path
                    infos.append(info)
        infos.sort(key=lambda info: (info.started_at, info.lane, info.id))
        return infos

    def messages(self, conversation_id: str) -> list[TranscriptRecord]:
        """The conversation's readable messages in order; ``[]`` if it does not exist."""
        conversation_id = require_name("conversation id", conversation_id)
        path = self._paths.get(conversation_id)
        if path is None or not os.path.isfile(path):
            found = self._find(conversation_id)
            if found is None:
                return []
            path = found[1]
        return list(read_records(conversation_id, path))

    # -- internals -------------------------------------------------------------------------
    # Listings work on plain name strings: a lane holds up to max_conversations files and is
    # listed on every open(), so building a Path per entry would dominate a turn's overhead.

    def make_lane_dir(self, lane: str) -> Path:
        # Confined again right before creating anything: a symlinked transcripts/ or lane
        # directory leading out of the home would otherwise make even the mkdir land outside.
        self._dirs.pop(lane, None)
        lane_dir = self._confined(lane)
        make_dirs(self._home, lane_dir)
        return lane_dir

    def _confined(self, lane: str) -> Path:
        found = self._dirs.get(lane)
        if found is None:
            found = self._dirs[lane] = confined(self._home, f"{TRANSCRIPTS_DIR}/{lane}")
        return found

    def created(self, path: Path) -> None:
        """Our own new file: add it to the cached listing instead of listing the lane again."""
        transcript_listings.LISTINGS.added(str(path.parent), path.name, str(path))

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

    def _listing(self, lane: str) -> Listing | None:
        try:
            lane_dir = self._confined(lane)
        except PersonaFileError as exc:
            log.warning("transcript.lane_refused", lane=lane, error=str(exc))
            return None
        return transcript_listings.LISTINGS.listing(str(lane_dir), lane)

    def _files(self, lane: str) -> list[tuple[str, str]]:
        """(name, path) of the lane's regular ``*.jsonl`` files; [] for a missing/refused lane."""
        listing = self._listing(lane)
        if listing is None:
            return []
        with transcript_listings.LISTINGS.lock:
            return list(listing.paths.items())

    def _find(self, conversation_id: str) -> tuple[ConversationInfo, str] | None:
        for lane in self._lane_names():
            listing = self._listing(lane)
            if listing is None:
                continue
            with transcript_listings.LISTINGS.lock:
                name = listing.ids.get(conversation_id)
                path = listing.paths.get(name) if name is not None else None
            if name is not None and path is not None:
                info = parse_file_name(lane, name)
                if info is not None:
                    self._paths[conversation_id] = path
                    return info, path
        return None

    def prune(self, lane: str, *, keep_room_for: str) -> None:
        """Drop the lane's oldest files so that one more still fits within the bound: out of
        the listing now, off the disk on the reaper's thread (module doc, "Growth bound")."""
        listing = self._listing(lane)
        if listing is None:
            return
        with transcript_listings.LISTINGS.lock:
            keep = listing.ids.get(keep_room_for)
            count = len(listing.order) - (1 if keep is not None else 0)
            excess = count - (self._max - 1)
            if excess <= 0:
                return
            scan = listing.order[: excess + 1 + PRUNE_SPARE_SCAN]
            oldest = [(name, listing.paths[name]) for name in scan if name != keep]
        # Of the oldest by start, the least recently written go: a conversation still going
        # on (a fleet session among one-shot runs in the same lane) was written lately.
        victims = sorted(oldest, key=lambda entry: _written_at(entry[1]))[:excess]
        if not victims:
            return
        # Queued before they leave the listing, so a re-listing meanwhile leaves them out too.
        transcript_listings.REAPER.delete(path for _, path in victims)
        for name, path in victims:
            transcript_listings.LISTINGS.removed(os.path.dirname(path), name)
            info = parse_file_name(lane, name)
            if info is not None:
                self._paths.pop(info.id, None)
                log.debug("transcript.pruned", lane=lane, conversation=info.id, bound=self._max)


def _written_at(path: str) -> int:
    """When ``path`` was last written (ns); a file gone already sorts first (nothing to lose)."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0

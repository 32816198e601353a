"""The write ledger: which keyed memory writes were already applied, and what they answered.

Why it exists: a fleet turn that wrote memory and then failed (a model error, a killed worker,
a lost lease) is retried, and the retry replays the same conversation, so the model repeats the
same write. Without a record, ``add`` would put the entry in MEMORY.md twice. A write made with
an idempotency key (:meth:`key`: the turn's work id, the write itself, and how many identical
writes came before it in this attempt) is recorded here in the same critical section as the
write, so a retried identical write is answered exactly as before and not applied again.

Where and how big: one small file per data path, beside its lock under ``<persona>/.locks/``
(``.locks/MEMORY.md.applied``), JSON lines of ``{"key", "message"}``. Each write appends its
line and fsyncs it (one fsync, no temp file or rename: issue 15); when the file holds twice
:data:`MAX_ENTRIES` lines it is rewritten atomically with the newest :data:`MAX_ENTRIES` (a
turn makes at most ``SOULFLEET_TURN_MAX_TOOL_CALLS`` writes; a retry comes within minutes), so
it never grows past that. A line torn by a crash mid-append is skipped when read (forgetting
one key is the safe side), and the next append starts on a fresh line. Read through the
bounded reader; created and compacted atomically like every persona file.

The data file is written first and the ledger after it: a crash between the two can repeat
one write (the old behaviour) but never lose one. So that the write lock is held for as few
fsyncs as possible, :meth:`WriteLedger.record` leaves the directory fsync of a created or
compacted ledger to its caller, after the lock (issue 15): until then a crash can forget the
newest entry, which again repeats a write but never loses one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import structlog

from workers.persona.files import read_prefix
from workers.persona.writes import remove_stale_temps, replace_bytes, write_synced

__all__ = ["LEDGER_SUFFIX", "MAX_ENTRIES", "WriteLedger", "write_key"]

LEDGER_SUFFIX = ".applied"
MAX_ENTRIES = 512
_MAX_BYTES = 512 * 1024

_log = structlog.get_logger("soulfleet.memory")


def write_key(scope: str, *parts: str, ordinal: int) -> str:
    """The idempotency key of one write: its scope (the turn's work id), what it does
    (action, target, text...) and how many identical writes preceded it in this attempt."""
    material = json.dumps([scope, *parts, ordinal], ensure_ascii=False)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


class WriteLedger:
    """The ledger file of one data path. Use it only while holding that path's write lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[tuple[str, str]] | None = None
        self._raw: bytes | None = None

    def _load(self) -> list[tuple[str, str]]:
        if self._entries is None:
            entries: list[tuple[str, str]] = []
            self._raw = read_prefix(self.path, _MAX_BYTES)
            raw = self._raw or b""
            for line in raw[:_MAX_BYTES].splitlines():
                try:
                    record = json.loads(line)
                    entries.append((str(record["key"]), str(record["message"])))
                except (ValueError, KeyError, TypeError):
                    continue  # a torn or hand-edited line: forgetting one key is the safe side
            self._entries = entries
        return self._entries

    def answer(self, key: str) -> str | None:
        """What the write with ``key`` answered when it was applied, or None if it never was."""
        for known, message in reversed(self._load()):
            if known == key:
                return message
        return None

    def record(self, key: str, message: str) -> None:
        """Remember that ``key`` was applied and answered ``message``.

        Appends one line and fsyncs it. A new ledger, or one at twice :data:`MAX_ENTRIES`
        lines, is instead written whole (newest :data:`MAX_ENTRIES`), fsynced and renamed into
        place: then fsync its directory (:func:`~workers.persona.writes.fsync_directory`) once
        the write lock is released."""
        entries = [*self._load(), (key, message)]
        raw = self._raw
        line = _line(key, message)
        if raw is None or len(entries) > 2 * MAX_ENTRIES or len(raw) + len(line) > _MAX_BYTES:
            entries = entries[-MAX_ENTRIES:]
            data = b"".join(_line(k, m) for k, m in entries)
            remove_stale_temps(self.path)
            replace_bytes(self.path, data)
        else:
            # A crash mid-append leaves a torn last line: start ours on a fresh one.
            data = raw + (b"" if not raw or raw.endswith(b"\n") else b"\n") + line
            _append(self.path, data[len(raw) :])
        self._entries, self._raw = entries, data
        _log.debug("memory.ledger_recorded", path=str(self.path), entries=len(entries))


def _line(key: str, message: str) -> bytes:
    return (json.dumps({"key": key, "message": message}, ensure_ascii=False) + "\n").encode()


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` to the existing file at ``path`` and fsync it (never through a link)."""
    flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    write_synced(os.open(path, flags), data)

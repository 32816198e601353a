"""The write ledger: which keyed memory writes were already applied, and what they answered.

Why it exists: a fleet turn that wrote memory and then failed (a model error, a killed worker,
a lost lease) is retried, and the retry replays the same conversation, so the model repeats the
same write. Without a record, ``add`` would put the entry in MEMORY.md twice. A write made with
an idempotency key (:meth:`key`: the turn's work id, the write itself, and how many identical
writes came before it in this attempt) is recorded here in the same critical section as the
write, so a retried identical write is answered exactly as before and not applied again.

It also carries the answers a holder leaves for writers whose queued writes it applied
(:mod:`workers.persona.write_queue`): those keys are made for the handoff, and the waiters read
them while they wait.

Where and how big: one small file per data path, beside its lock under ``<persona>/.locks/``
(``.locks/MEMORY.md.applied``), JSON lines of ``{"key", "message"}`` after a first line naming
the file's generation (``{"generation": "<16 hex>"}``, new at each creation and compaction:
:func:`ledger_identity`; a compacted one also names the generation it replaced, ``"since"``,
and ``"kept_from"``, the offset in that one from which it kept every answer). Each write
appends its line, with no fsync of its own (issue 15, below); when the file holds twice
:data:`MAX_ENTRIES` answers (counted from where this process last counted) it is rewritten
atomically with the newest :data:`MAX_ENTRIES` (a turn makes at most
``SOULFLEET_TURN_MAX_TOOL_CALLS`` writes; a retry comes within minutes), so it never grows
past that. A line torn by a crash mid-append is skipped when read (forgetting
one key is the safe side), and the next append starts on a fresh line. Read through the
bounded reader; created and compacted atomically like every persona file.

The data file is made durable first (fsync, rename, directory fsync) and the ledger line is
appended after it: the line can never be on disk ahead of its write, so a crash can repeat one
write (the old behaviour) but never lose one. The line itself is not fsynced (issue 15: it was
a third fsync under the lock, and fleet turns always keep a ledger). What that gives up is
narrow: a process that dies (a SIGKILL, an OOM kill, a lost lease: what retries turns) leaves
its appended line in the page cache, where the retry reads it; only a crash of the whole machine
within the filesystem's commit interval (seconds) can forget the newest lines, and then a
retried turn repeats those writes once.

A writer that dies between its rename and its answers (a SIGKILL in those microseconds) would
leave the write applied but unrecorded: its retry, or the queued writers it served, would then
apply it a second time. So just before the rename it appends an intent
(:meth:`WriteLedger.intend`: the answers it will record and the new file's inode and size),
and every holder first settles a ledger that ends with one (:meth:`WriteLedger.settle`): if
the data file is the one the intent names, the rename happened and its answers are recorded;
otherwise it never did and the intent is voided. A created or compacted ledger is still
written whole, fsynced and renamed (:meth:`WriteLedger.record` leaves its directory fsync to
the caller, after the lock), so a compaction can never leave a torn or empty ledger.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
import threading
from collections import OrderedDict
from typing import NamedTuple

import structlog

from workers.persona.files import read_prefix
from workers.persona.writes import remove_stale_temps, replace_bytes, write_all

__all__ = [
    "LEDGER_SUFFIX",
    "MAX_ENTRIES",
    "LedgerIdentity",
    "WriteLedger",
    "find_answer",
    "ledger_identity",
    "write_key",
]

LEDGER_SUFFIX = ".applied"
_APPEND = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
MAX_ENTRIES = 512
#: How an intent line starts (:meth:`WriteLedger.intend`), and the line that voids one.
_INTENT_PREFIX = b'{"intent"'
_VOID_LINE = b'{"void": true}\n'
#: How a ledger's first line starts: the generation a creation or compaction gave it.
_GENERATION_PREFIX = b'{"generation": "'
#: How much of a ledger's end :meth:`WriteLedger.settle` reads to find a trailing intent.
_TAIL_BYTES = 256
#: How much of a ledger's start :func:`ledger_identity` reads: its whole first line.
_HEAD_BYTES = 256
_TAIL = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_BYTES = 512 * 1024
#: How an answer line starts (what :func:`_line` writes): counted to know when to compact.
_ANSWER = b'{"key"'
#: Ledgers whose answers this process counted: (path, generation) -> (bytes counted, answers).
_counted: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
_counted_guard = threading.Lock()
_COUNTED_MAX = 4096
#: A compaction's ``kept_from`` when it cannot vouch for any offset (beyond any ledger's size).
_UNPROVABLE = 1 << 62

_log = structlog.get_logger("soulfleet.memory")


def write_key(scope: str, *parts: str, ordinal: int) -> str:
    """The idempotency key of one write: its scope (the turn's work id), what it does
    (action, target, text...) and how many identical writes preceded it in this attempt."""
    material = json.dumps([scope, *parts, ordinal], ensure_ascii=False)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


class WriteLedger:
    """The ledger file of one data path. Use it only while holding that path's write lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # A plain string: building a Path cost every commit more than its ledger reads.
        self.path = os.fspath(path)
        self._loaded = False
        self._raw: bytes | None = None
        #: What this object appended since it read the ledger (:meth:`_append`).
        self._after = b""
        self._fd: int | None = None
        #: :meth:`intend` created the ledger: its directory must be fsynced after the lock.
        self._created = False

    def prepare(self) -> None:
        """Before the write it will record: make sure the ledger can take its line, or raise
        the ``OSError`` (the write is then refused, nothing changed). A ledger that cannot be
        written must not let a write through: a retry would apply it a second time.

        Opens the ledger for appending (kept for :meth:`record`; :meth:`close` it), or, with no
        ledger yet, checks that its directory is writable."""
        if self._bytes() is None:
            parent = os.path.dirname(self.path)
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, "Permission denied", parent)
            return
        self._fd = os.open(self.path, _APPEND)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _read(self) -> bytes | None:
        """The ledger's bytes as read (once); None when there is no ledger yet."""
        if not self._loaded:
            self._raw = read_prefix(self.path, _MAX_BYTES)
            self._loaded = True
        return self._raw

    def _bytes(self) -> bytes | None:
        """The ledger's bytes as read, then what this object appended (None: no ledger)."""
        self._read()
        if self._after:  # only after a settle recorded a dead writer's answers, in a commit
            return (self._raw or b"") + self._after
        return self._raw

    def _compacted(self, answered: list[tuple[str, str]]) -> bytes:
        """The ledger rewritten with room for ``answered``: a new generation line naming the
        one it replaces and from where in it every answer was kept, then the newest answers
        (:data:`MAX_ENTRIES` with ``answered``, which the caller appends)."""
        whole = self._bytes() or b""
        entries = _parsed_at(whole[:_MAX_BYTES])
        keep = max(0, MAX_ENTRIES - len(answered))
        kept = entries[len(entries) - keep :] if keep else []
        if len(whole) > _MAX_BYTES:  # answers past the bound were never read: none is provable
            kept_from = _UNPROVABLE
        elif len(kept) == len(entries):
            kept_from = 0
        else:
            kept_from = kept[0][0] if kept else len(whole)
        head = _generation_line(since=_generation(whole), kept_from=kept_from)
        return head + b"".join(_line(key, message) for _, key, message in kept)

    def intend(self, identity: tuple[int, int], answered: list[tuple[str, str]]) -> None:
        """Before a keyed or batched write's rename: note what it will answer and what the data
        file will be once renamed (``identity``: inode, size). If the writer dies before the
        answers are recorded, the next holder finishes its work (:meth:`settle`). Appended
        without an fsync, like the answers."""
        raw = self._bytes()
        line = _intent_line(identity, answered)
        if raw is None:  # a new ledger is written whole, like any created persona file
            data = _generation_line() + line
            remove_stale_temps(self.path)
            replace_bytes(self.path, data)
            self._raw, self._created = data, True
            return
        self._append(line, fd=self._fd)

    def settle(self, data: str) -> None:
        """Finish a commit whose writer died between its intent and its answers (its ledger
        ends with the intent): if the data file is what the intent named, the rename happened
        and its answers are recorded now (so neither its waiters nor a retry apply those
        writes again); otherwise it never happened and the intent is voided. Call first,
        under the lock."""
        tail = self._raw if self._loaded else self._tail()
        if not tail or not _last_line(tail).startswith(_INTENT_PREFIX):
            return
        intent = _parse_intent(_last_line(self._bytes() or b""))
        try:
            info = os.stat(data, follow_symlinks=False)
            renamed = intent is not None and (info.st_ino, info.st_size) == intent[0]
        except FileNotFoundError:
            renamed = False
        if intent is not None and renamed:
            _log.warning(
                "memory.commit_finished",
                path=self.path,
                writes=len(intent[1]),
                reason="its writer died after the write, before recording its answers",
            )
            self.record_all(intent[1])
            return
        self._append(_VOID_LINE)

    def _tail(self) -> bytes | None:
        """The ledger's last bytes, enough to tell whether it ends with an intent (most
        commits need nothing more); None without a ledger, which then is not read again."""
        try:
            fd = os.open(self.path, _TAIL)
        except FileNotFoundError:
            self._loaded, self._raw = True, None
            return None
        except OSError:
            return None  # whoever needs the ledger reads it and says what is wrong
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None
            start = max(0, info.st_size - _TAIL_BYTES)
            tail = os.pread(fd, _TAIL_BYTES, start)
        finally:
            os.close(fd)
        if start and b"\n" not in tail.rstrip(b"\n"):
            return self._bytes()  # the last line starts further back: read it all
        return tail

    def _append(self, line: bytes, *, fd: int | None = None) -> None:
        """Append ``line`` (on a fresh line after a torn one) to the loaded ledger, through
        ``fd`` when given. What was appended is kept apart from the bytes read, so a long
        ledger is never copied to add a line to it."""
        written = self._after or self._raw or b""
        data = (b"" if not written or written.endswith(b"\n") else b"\n") + line
        target = fd if fd is not None else os.open(self.path, _APPEND)
        try:
            write_all(target, data)
        finally:
            if target != fd:
                os.close(target)
        self._after += data

    def answer(self, key: str) -> str | None:
        """What the write with ``key`` answered when it was applied, or None if it never was."""
        raw = self._bytes()
        return None if raw is None else find_answer(raw, key)

    def record(self, key: str, message: str) -> bool:
        """Remember that ``key`` was applied and answered ``message``.

        Appends one line, not fsynced (see the module), and returns False. A new ledger, or
        one at twice :data:`MAX_ENTRIES` lines, is instead written whole (newest
        :data:`MAX_ENTRIES`), fsynced and renamed into place, and True says so: then fsync its
        directory (:func:`~workers.persona.writes.fsync_directory`) once the write lock is
        released."""
        return self.record_all([(key, message)])

    def record_all(self, answered: list[tuple[str, str]]) -> bool:
        """:meth:`record` for several writes at once (one append): (key, message) pairs."""
        raw = self._read()
        lines = b"".join(_line(key, message) for key, message in answered)
        # Answers only (intents do not count), without joining what was read and appended.
        count = 0 if raw is None else _answers(self.path, raw) + self._after.count(_ANSWER)
        size = 0 if raw is None else len(raw) + len(self._after)
        if raw is None or count >= 2 * MAX_ENTRIES or size + len(lines) > _MAX_BYTES:
            data = self._compacted(answered) if raw is not None else _generation_line()
            data += b"".join(_line(k, m) for k, m in answered)
            remove_stale_temps(self.path)
            replace_bytes(self.path, data)
            self._raw, self._after = data, b""
            replaced = True
        else:
            self._append(lines, fd=self._fd)  # after a torn last line, on a fresh one
            replaced = False
        _log.debug("memory.ledger_recorded", path=self.path, lines=len(answered))
        return replaced or self._created


class LedgerIdentity(NamedTuple):
    """Which ledger is at a path, and how long it was when looked at."""

    inode: int
    #: What its first line names ("" for a ledger written before generations): new at each
    #: creation and compaction.
    generation: str
    size: int
    #: For a compacted ledger, the generation it replaced ("" for a created one) and the
    #: offset in that one from which every answer was kept.
    since: str = ""
    kept_from: int = 0

    def same_ledger(self, other: LedgerIdentity | None) -> bool:
        """Whether ``other`` is this very ledger (appended to since, perhaps, never
        compacted): the inode alone cannot tell, since ext4 hands a freed inode number
        straight back to the next file."""
        return other is not None and (self.inode, self.generation) == (
            other.inode,
            other.generation,
        )


def ledger_identity(path: str) -> LedgerIdentity | None:
    """Which ledger is at ``path`` (None when there is none). A created or compacted ledger
    starts with a new random generation, so a waiter can tell a compaction (which may have
    dropped its answer) from appends, even when the new file reuses the old inode number."""
    try:
        fd = os.open(path, _TAIL)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        head = os.pread(fd, _HEAD_BYTES, 0) if stat.S_ISREG(info.st_mode) else b""
    finally:
        os.close(fd)
    since, kept_from = _lineage(head)
    return LedgerIdentity(info.st_ino, _generation(head), info.st_size, since, kept_from)


def _lineage(head: bytes) -> tuple[str, int]:
    """What a compacted ledger's first line says it replaced: (generation, kept from)."""
    if not head.startswith(_GENERATION_PREFIX) or b'"since"' not in head:
        return "", 0
    try:
        record = json.loads(head[: head.index(b"\n")])
        return str(record["since"]), int(record["kept_from"])
    except (ValueError, KeyError, TypeError):
        return "", 0


def _generation(raw: bytes) -> str:
    """The generation a ledger's first line names ("" for none)."""
    if not raw.startswith(_GENERATION_PREFIX):
        return ""
    end = raw.find(b'"', len(_GENERATION_PREFIX), len(_GENERATION_PREFIX) + 64)
    return "" if end < 0 else raw[len(_GENERATION_PREFIX) : end].decode("ascii", "replace")


def _answers(path: str, raw: bytes) -> int:
    """How many answer lines ledger bytes ``raw`` (read from ``path``) hold.

    Counted from where this process last counted the same ledger: between compactions a
    ledger is only appended to, and each compaction names a new generation, so only the bytes
    appended since need counting (counting a whole ledger, ~200 KiB of answers, took ~0.1 ms
    under the lock on every commit that recorded one: issue 15). A ledger without a
    generation, or one shorter than counted (replaced by hand), is counted whole."""
    generation = _generation(raw)
    if not generation:
        return raw.count(_ANSWER)
    key = (path, generation)
    with _counted_guard:
        seen = _counted.get(key)
    if seen is not None and seen[0] <= len(raw):
        # From just before the counted end: an answer cut there was not counted yet.
        count = seen[1] + raw.count(_ANSWER, max(0, seen[0] - len(_ANSWER) + 1))
    else:
        count = raw.count(_ANSWER)
    with _counted_guard:
        _counted[key] = (len(raw), count)
        _counted.move_to_end(key)
        while len(_counted) > _COUNTED_MAX:
            _counted.popitem(last=False)
    return count


def _generation_line(*, since: str = "", kept_from: int = 0) -> bytes:
    """A created ledger's first line, or a compacted one's: then it also names the generation
    it replaced (``since``) and the offset in it from which every answer was kept."""
    line = _GENERATION_PREFIX + secrets.token_hex(8).encode() + b'"'
    if since:
        line += b', "since": ' + json.dumps(since).encode() + b', "kept_from": %d' % kept_from
    return line + b"}\n"


def find_answer(raw: bytes, key: str) -> str | None:
    """The message recorded for ``key`` in ledger bytes ``raw`` (the newest), or None."""
    # Nearly every write is new: a key absent from the bytes needs no parsing (parsing up to
    # 1,024 lines on every write cost a fleet turn's add more than its fsyncs). Looked for as
    # _line writes it, at the start of a line's record, so the intent naming a waiter's key
    # (or a message quoting one) is never taken for its answer.
    needle = b'{"key": ' + json.dumps(key).encode() + b","
    end = len(raw)
    while (found := raw.rfind(needle, 0, end)) >= 0:
        # Only the newest line that holds the key is parsed (a served waiter that took the
        # lock anyway parsed the whole ledger under it: half a millisecond per write).
        start = raw.rfind(b"\n", 0, found) + 1
        stop = raw.find(b"\n", found)
        entry = _parsed(raw[start : len(raw) if stop < 0 else stop])
        if entry and entry[0][0] == key:
            return entry[0][1]
        end = found  # a torn or hand-edited line: look further back
    return None


def _parsed_at(raw: bytes) -> list[tuple[int, str, str]]:
    """:func:`_parsed` with each answer's offset in ``raw``."""
    entries: list[tuple[int, str, str]] = []
    offset = 0
    for line in raw.splitlines(keepends=True):
        for key, message in _parsed(line):
            entries.append((offset, key, message))
        offset += len(line)
    return entries


def _parsed(raw: bytes) -> list[tuple[str, str]]:
    entries: list[tuple[str, str]] = []
    for line in raw.splitlines():
        try:
            record = json.loads(line)
            entries.append((str(record["key"]), str(record["message"])))
        except (ValueError, KeyError, TypeError):
            continue  # a torn or hand-edited line: forgetting one key is the safe side
    return entries


def _intent_line(identity: tuple[int, int], answered: list[tuple[str, str]]) -> bytes:
    record = {"intent": list(identity), "answers": [list(pair) for pair in answered]}
    return (json.dumps(record, ensure_ascii=False) + "\n").encode()


def _last_line(raw: bytes) -> bytes:
    body = raw.rstrip(b"\n")
    return body[body.rfind(b"\n") + 1 :]


def _parse_intent(line: bytes) -> tuple[tuple[int, int], list[tuple[str, str]]] | None:
    """An intent line's (inode, size) and answers; None for a torn or hand-edited one."""
    try:
        record = json.loads(line)
        inode, size = record["intent"]
        answers = [(str(key), str(message)) for key, message in record["answers"]]
        return (int(inode), int(size)), answers
    except (ValueError, KeyError, TypeError):
        return None


def _line(key: str, message: str) -> bytes:
    return (json.dumps({"key": key, "message": message}, ensure_ascii=False) + "\n").encode()

"""The write ledger's lines: what each line of ``.locks/<file>.applied`` says, how it is
written, and how it is read back (:mod:`workers.persona.ledger` runs the ledger itself).

* The first line names the file's generation, new at each creation and compaction
  (``{"generation": "<16 hex>"}``); a compacted one also names the generation it replaced,
  ``"since"``, and ``"kept_from"``, the offset in that one from which it kept every answer
  (:func:`ledger_identity` reads them: a waiter uses them to know whether its answer could
  have been dropped).
* An answer: ``{"key": "<key>", "message": "<what the write answered>"}``
  (:func:`answer_line`, found again by :func:`find_answer`).
* An intent, appended before a commit's rename: ``{"intent": [inode, size], "answers": [...]}``
  (:func:`intent_line`), and the line that voids one (:data:`VOID_LINE`).

Every reader skips a torn or hand-edited line: forgetting one key is the safe side.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
import threading
from collections import OrderedDict
from typing import NamedTuple

__all__ = [
    "INTENT_PREFIX",
    "UNPROVABLE",
    "VOID_LINE",
    "Intent",
    "LedgerIdentity",
    "answer_line",
    "answers_in",
    "count_answers",
    "find_answer",
    "generation_line",
    "generation_of",
    "intent_line",
    "last_line",
    "ledger_identity",
    "ledger_snapshot",
    "parse_intent",
    "parsed_at",
    "tail_digest",
]

#: How an intent line starts (:func:`intent_line`), and the line that voids one.
INTENT_PREFIX = b'{"intent"'
VOID_LINE = b'{"void": true}\n'
#: A compaction's ``kept_from`` when it cannot vouch for any offset (beyond any ledger's size).
UNPROVABLE = 1 << 62
#: How a ledger's first line starts: the generation a creation or compaction gave it.
_GENERATION_PREFIX = b'{"generation": "'
#: How much of a ledger's start :func:`ledger_identity` reads: its whole first line.
_HEAD_BYTES = 256
#: The most of a ledger :func:`ledger_snapshot` reads (the ledger's own bound, and one byte).
_SNAPSHOT_BYTES = 512 * 1024 + 1
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
#: How an answer line starts (what :func:`answer_line` writes): counted to know when to compact.
_ANSWER = b'{"key"'
#: Ledgers whose answers this process counted: (path, generation) -> (bytes counted, answers).
_counted: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
_counted_guard = threading.Lock()
_COUNTED_MAX = 4096


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
    read = _read_start(path, _HEAD_BYTES)
    if read is None:
        return None
    info, head = read
    since, kept_from = _lineage(head)
    return LedgerIdentity(info.st_ino, generation_of(head), info.st_size, since, kept_from)


def ledger_snapshot(path: str) -> tuple[LedgerIdentity, bytes] | None:
    """:func:`ledger_identity` and the ledger's whole lines, read through one descriptor: its
    size is where those lines end, so an answer not among them is appended after it (None
    when there is no ledger, or it cannot be read whole within its bound)."""
    read = _read_start(path, _SNAPSHOT_BYTES)
    if read is None:
        return None
    info, raw = read
    if not raw or len(raw) == _SNAPSHOT_BYTES:
        return None
    whole = raw[: raw.rfind(b"\n") + 1]  # a line being appended is after the snapshot
    since, kept_from = _lineage(whole[:_HEAD_BYTES])
    identity = LedgerIdentity(info.st_ino, generation_of(whole), len(whole), since, kept_from)
    return identity, whole


def _read_start(path: str, limit: int) -> tuple[os.stat_result, bytes] | None:
    """The ledger's status and up to ``limit`` bytes from its start, through one descriptor
    (no bytes for anything but a regular file); None when there is no ledger."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        return info, os.pread(fd, limit, 0) if stat.S_ISREG(info.st_mode) else b""
    finally:
        os.close(fd)


def _lineage(head: bytes) -> tuple[str, int]:
    """What a compacted ledger's first line says it replaced: (generation, kept from)."""
    if not head.startswith(_GENERATION_PREFIX) or b'"since"' not in head:
        return "", 0
    try:
        record = json.loads(head[: head.index(b"\n")])
        return str(record["since"]), int(record["kept_from"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return "", 0


def generation_of(raw: bytes) -> str:
    """The generation a ledger's first line names ("" for none)."""
    if not raw.startswith(_GENERATION_PREFIX):
        return ""
    end = raw.find(b'"', len(_GENERATION_PREFIX), len(_GENERATION_PREFIX) + 64)
    return "" if end < 0 else raw[len(_GENERATION_PREFIX) : end].decode("ascii", "replace")


def answers_in(data: bytes) -> int:
    """How many answer lines ``data`` holds, counted whole."""
    return data.count(_ANSWER)


def count_answers(path: str, raw: bytes) -> int:
    """How many answer lines ledger bytes ``raw`` (read from ``path``) hold.

    Counted from where this process last counted the same ledger: between compactions a
    ledger is only appended to, and each compaction names a new generation, so only the bytes
    appended since need counting (counting a whole ledger, ~200 KiB of answers, took ~0.1 ms
    under the lock on every commit that recorded one: issue 15). A ledger without a
    generation, or one shorter than counted (replaced by hand), is counted whole."""
    generation = generation_of(raw)
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


def generation_line(*, since: str = "", kept_from: int = 0) -> bytes:
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
    # answer_line writes it, at the start of a line's record, so the intent naming a waiter's key
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


def parsed_at(raw: bytes) -> list[tuple[int, str, str]]:
    """:func:`_parsed` with each answer's offset in ``raw``."""
    entries: list[tuple[int, str, str]] = []
    offset = 0
    for line in raw.splitlines(keepends=True):
        for key, message in _parsed(line):
            entries.append((offset, key, message))
        offset += len(line)
    return entries


def _parsed(raw: bytes) -> list[tuple[str, str]]:
    """The (key, message) of each whole answer line in ``raw``."""
    entries: list[tuple[str, str]] = []
    for line in raw.splitlines():
        try:
            record = json.loads(line)
            entries.append((str(record["key"]), str(record["message"])))
        except (ValueError, KeyError, TypeError, RecursionError):
            continue  # a torn or hand-edited line: forgetting one key is the safe side
    return entries


class Intent(NamedTuple):
    """A parsed intent line."""

    #: The data file as the write leaves it: (inode, size).
    identity: tuple[int, int]
    answers: list[tuple[str, str]]
    #: An append's bytes, as (length, digest) (:func:`tail_digest`); None for a rename.
    tail: tuple[int, str] | None = None


def tail_digest(data: bytes) -> str:
    """How an intent names an append's bytes without holding them."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def intent_line(
    identity: tuple[int, int], answered: list[tuple[str, str]], tail: bytes = b""
) -> bytes:
    """What a commit appends before its write: the data file it will leave, its answers, and
    for an append its bytes' length and digest (so they are found at the end the intent
    names even after something was appended behind them)."""
    record: dict[str, object] = {
        "intent": list(identity),
        "answers": [list(pair) for pair in answered],
    }
    if tail:
        record["tail"] = [len(tail), tail_digest(tail)]
    return (json.dumps(record, ensure_ascii=False) + "\n").encode()


def last_line(raw: bytes) -> bytes:
    """The last non-empty line of ``raw``."""
    body = raw.rstrip(b"\n")
    return body[body.rfind(b"\n") + 1 :]


def parse_intent(line: bytes) -> Intent | None:
    """An intent line's parts; None for a torn or hand-edited one."""
    try:
        record = json.loads(line)
        inode, size = record["intent"]
        answers = [(str(key), str(message)) for key, message in record["answers"]]
        tail = None
        if "tail" in record:
            length, digest = record["tail"]
            tail = (int(length), str(digest))
        return Intent((int(inode), int(size)), answers, tail)
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def answer_line(key: str, message: str) -> bytes:
    """The line recording that the write ``key`` was applied and answered ``message``."""
    return (json.dumps({"key": key, "message": message}, ensure_ascii=False) + "\n").encode()

"""The write ledger: which keyed memory writes were already applied, and what they answered.

Why it exists: a fleet turn that wrote memory and then failed (a model error, a killed worker,
a lost lease) is retried, and the retry replays the same conversation, so the model repeats the
same write. Without a record, ``add`` would put the entry in MEMORY.md twice. A write made with
an idempotency key (:func:`write_key`: the turn's work id, the write itself, and how many identical
writes came before it in this attempt) is recorded here in the same critical section as the
write, so a retried identical write is answered exactly as before and not applied again.

It also carries the answers a holder leaves for writers whose queued writes it applied
(:mod:`workers.persona.write_queue`): those keys are made for the handoff, and the waiters read
them while they wait.

Where and how big: one small file per data path, beside its lock under ``<persona>/.locks/``
(``.locks/MEMORY.md.applied``), JSON lines of ``{"key", "message"}`` after a first line naming
the file's generation, new at each creation and compaction (what each line says:
:mod:`workers.persona.ledger_lines`). Each write appends its line, with no fsync of its own
(issue 15, below); when the file holds twice :data:`MAX_ENTRIES` answers (counted from where
this process last counted) it is rewritten atomically with the newest :data:`MAX_ENTRIES` (a
turn makes at most ``SOULFLEET_TURN_MAX_TOOL_CALLS`` writes; a retry comes within minutes), so
it never grows past that. A line torn by a crash mid-append is skipped when read (forgetting
one key is the safe side), and the next append starts on a fresh line. Read through the
bounded reader; created and compacted atomically like every persona file.

The data file is made durable first (an append and its ``fdatasync``, or fsync, rename and
directory fsync) and the ledger line is
appended after it: the line can never be on disk ahead of its write, so a crash can repeat one
write (the old behaviour) but never lose one. The line itself is not fsynced (issue 15: it was
a third fsync under the lock, and fleet turns always keep a ledger). What that gives up is
narrow: a process that dies (a SIGKILL, an OOM kill, a lost lease: what retries turns) leaves
its appended line in the page cache, where the retry reads it; only a crash of the whole machine
within the filesystem's commit interval (seconds) can forget the newest lines, and then a
retried turn repeats those writes once.

A writer that dies between its write and its answers (a SIGKILL in those microseconds) would
leave the write applied but unrecorded: its retry, or the queued writers it served, would then
apply it a second time. So just before the rename or the append it appends an intent
(:meth:`WriteLedger.intend`: the answers it will record, the data file's inode and size as
they will be, and for an append its bytes' length and digest), and every holder first settles
a ledger that ends with one (:meth:`WriteLedger.settle`): if the data file is what the intent
names (for an append: its bytes at the end it named, whatever was appended after), the write
happened: the file and its directory are flushed (its writer may have died before it did) and
its answers recorded; otherwise it never did and the intent is voided. A created or compacted
ledger is still written whole, fsynced and renamed (:meth:`WriteLedger.record` leaves its
directory fsync to the caller, after the lock), so a compaction can never leave a torn or
empty ledger.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat

import structlog

from workers.persona.files import read_prefix
from workers.persona.ledger_lines import (
    INTENT_PREFIX,
    UNPROVABLE,
    VOID_LINE,
    Intent,
    answer_line,
    answers_in,
    count_answers,
    find_answer,
    generation_line,
    generation_of,
    intent_line,
    last_line,
    parse_intent,
    parsed_at,
    tail_digest,
)
from workers.persona.memory_spec import unflushed_message
from workers.persona.writes import (
    fsync_directory,
    fsync_file,
    open_regular,
    remove_stale_temps,
    replace_bytes,
    write_all,
)

__all__ = [
    "LEDGER_SUFFIX",
    "MAX_BYTES",
    "MAX_ENTRIES",
    "WriteLedger",
    "write_key",
]

LEDGER_SUFFIX = ".applied"
_APPEND = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
MAX_ENTRIES = 512
#: How much of a ledger's end :meth:`WriteLedger.settle` reads to find a trailing intent.
_TAIL_BYTES = 256
_TAIL = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
#: The most of a ledger a holder reads. Every write keeps the ledger within it, the intent line
#: before a rename included, so the next holder always reads a dead writer's intent whole.
MAX_BYTES = 512 * 1024

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
        #: :meth:`intend` wrote the ledger whole (created or compacted it): its directory
        #: must be fsynced after the lock.
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
        self._fd = open_regular(self.path, _APPEND)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _read(self) -> bytes | None:
        """The ledger's bytes as read (once); None when there is no ledger yet."""
        if not self._loaded:
            self._raw = read_prefix(self.path, MAX_BYTES)
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
        entries = parsed_at(whole[:MAX_BYTES])
        keep = max(0, MAX_ENTRIES - len(answered))
        kept = entries[len(entries) - keep :] if keep else []
        if len(whole) > MAX_BYTES:  # answers past the bound were never read: none is provable
            kept_from = UNPROVABLE
        elif len(kept) == len(entries):
            kept_from = 0
        else:
            kept_from = kept[0][0] if kept else len(whole)
        head = generation_line(since=generation_of(whole), kept_from=kept_from)
        return head + b"".join(answer_line(key, message) for _, key, message in kept)

    def intend(
        self, identity: tuple[int, int], answered: list[tuple[str, str]], *, tail: bytes = b""
    ) -> None:
        """Before a keyed or batched write's rename or append: note what it will answer and
        what the data file will be once written (``identity``: inode, size; ``tail``: an
        append's bytes). If the writer dies before the answers are recorded, the next holder
        finishes its work (:meth:`settle`). Appended without an fsync, like the answers."""
        raw = self._bytes()
        line = intent_line(identity, answered, tail)
        if raw is None or len(raw) + len(line) > MAX_BYTES:
            # A new ledger is written whole, like any created persona file; a full one is
            # compacted first: an intent past the bound would be read cut, and voided.
            self._rewrite(answered, line)
            self._created = True
            return
        self._append(line, fd=self._fd)

    def _rewrite(self, answered: list[tuple[str, str]], tail: bytes) -> None:
        """Write the ledger whole, durably, in one rename: a new one (there was none), or this
        one compacted with room for ``answered``; then ``tail``."""
        head = generation_line() if self._bytes() is None else self._compacted(answered)
        data = head + tail
        remove_stale_temps(self.path)
        replace_bytes(self.path, data)
        self.close()  # its descriptor names the replaced file: later appends reopen
        self._raw, self._after = data, b""

    def settle(self, data: str, *, label: str = "") -> None:
        """Finish a commit whose writer died between its intent and its answers (its ledger
        ends with the intent): if the data file is what the intent named, the write (a rename
        or an append) happened: it is made durable and its answers are recorded now (so
        neither its waiters nor a retry apply those writes again; if the flush fails, each
        answer is replaced by what an applied but unflushed write answers, ``label`` naming
        the file); otherwise it never happened and the intent is voided. Call first, under
        the lock."""
        tail = self._raw if self._loaded else self._tail()
        if not tail or not last_line(tail).startswith(INTENT_PREFIX):
            return
        intent = parse_intent(last_line(self._bytes() or b""))
        if intent is not None and _written(data, intent):
            answers = intent.answers
            try:
                # Its writer may have died before the flush that makes its write durable, which
                # every answer must follow: an append's (the data) or a rename's (the directory).
                fsync_file(data)
                fsync_directory(os.path.dirname(data) or ".")
            except OSError as error:
                # Applied, perhaps not durable: its writers (a waiter, a retry) hear that, and
                # none applies its write again.
                note = unflushed_message(label or os.path.basename(data), error)
                answers = [(key, note) for key, _ in answers]
            _log.warning(
                "memory.commit_finished",
                path=self.path,
                writes=len(answers),
                reason="its writer died after the write, before recording its answers",
            )
            self.record_all(answers)
            return
        self._append(VOID_LINE)

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
        target = fd if fd is not None else open_regular(self.path, _APPEND)
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
        one at twice :data:`MAX_ENTRIES` answers, is instead written whole (newest
        :data:`MAX_ENTRIES`), fsynced and renamed into place, and True says so: then fsync its
        directory (:func:`~workers.persona.writes.fsync_directory`) once the write lock is
        released."""
        return self.record_all([(key, message)])

    def record_all(self, answered: list[tuple[str, str]]) -> bool:
        """:meth:`record` for several writes at once (one append): (key, message) pairs."""
        raw = self._read()
        lines = b"".join(answer_line(key, message) for key, message in answered)
        # Answers only (intents do not count), without joining what was read and appended.
        count = 0 if raw is None else count_answers(self.path, raw) + answers_in(self._after)
        size = 0 if raw is None else len(raw) + len(self._after)
        if raw is None or count >= 2 * MAX_ENTRIES or size + len(lines) > MAX_BYTES:
            self._rewrite(answered, lines)
            replaced = True
        else:
            self._append(lines, fd=self._fd)  # after a torn last line, on a fresh one
            replaced = False
        _log.debug("memory.ledger_recorded", path=self.path, lines=len(answered))
        return replaced or self._created


def _written(data: str, intent: Intent) -> bool:
    """Whether the data file shows the intent's write: the file a rename leaves (its inode and
    size), or an append's bytes at the end it named, whatever was appended after them (a
    person's `echo >>` after its writer died; an append that never happened is not taken for
    one because something of its length was)."""
    try:
        info = os.stat(data, follow_symlinks=False)
    except FileNotFoundError:
        return False
    inode, size = intent.identity
    if intent.tail is None:
        return (info.st_ino, info.st_size) == (inode, size)
    length, digest = intent.tail
    if info.st_ino != inode or info.st_size < size or not 0 < length <= size:
        return False
    try:
        fd = os.open(data, _TAIL)
    except OSError:
        return False  # gone or swapped since the stat: not the file the intent names
    try:
        if os.fstat(fd).st_ino != inode:
            return False
        found = os.pread(fd, length, size - length)
    finally:
        os.close(fd)
    return tail_digest(found) == digest

"""The write queue: memory writes that found their file's lock taken, handed to its holder.

Why (issue 15): writes to one memory file are serialised by its lock, and each pays its own
fsyncs, so 4 processes adding to one MEMORY.md ran at under half the rate at which 4 writers
replace 4 separate files (those share the journal's commits). A writer that finds the lock
taken now appends its write to ``.locks/<file>.queue`` before it waits; whoever holds the lock
next takes the queue and applies every queued write in the same durable write as its own
(one flush for the whole batch, under the lock, see :mod:`workers.persona.memory_commit`),
and then records each one's answer in the write ledger (:mod:`workers.persona.ledger`) under
the queued write's key. The waiter, watching the ledger while it waits, finds its answer
there and returns it (the write is durable already); if it is not there (the
holder took the queue before the append, a crash, an expired entry), it applies its write
itself, exactly as before.

What keeps it safe:

* **One kernel's writers per queue.** The queue is appended with ``O_APPEND``, which one
  kernel keeps whole and ordered; across NFS clients it does not, so in shared mode each
  machine has its own queue (:func:`workers.persona.shared_claims.queue_for`), taken only by a
  holder on that machine.
* **Taking is reading then truncating, under the lock.** An append that lands between the two
  is lost from the queue; its writer is still waiting with the write in hand and applies it
  (unless the ledger was compacted meanwhile in a way that may have dropped its answer: then
  it says the write may have been applied, :meth:`Handoff.untraceable`). A torn last line (an
  append in progress) is left out the same way. Taking always consumes what it read: a writer
  holding the lock takes its own entry with the rest, so it is never left behind for the next
  holder to apply again after its writer did.
* **Queued writes are checked again** by the holder (:func:`take`), as the model's arguments
  are, and must name the holder's own file. A line that fails is ignored (its writer applies
  its write itself).
* **Applied once.** A key queued twice (a turn's attempt killed while its write waited, then
  its retry) is applied once per batch (:mod:`workers.persona.memory_commit`). A writer whose
  entry another holder took and whose answer is not in the ledger applies its write itself
  only if no answer can have left the ledger since (:meth:`Handoff.untraceable`: the ledger is
  the one it queued on, or one compaction of it kept every answer appended since it queued
  and none was there before); otherwise it says the write may have been applied. A turn's
  retry looks for its key in the ledger before it queues: a write an earlier attempt applied
  is answered as before at once, without the lock (:meth:`Handoff.enqueue`).
* **Bounded in time.** Each entry carries its writer's deadline (wall clock). The holder applies
  only entries with at least :data:`SERVE_MARGIN` seconds left, so a writer that gives up
  ("lock not acquired") is, short of a holder stalled that long mid-write, not served behind
  its back; its timeout message still says the write may have been applied.
* **Bounded in size.** At most :data:`MAX_QUEUE_BYTES` are read; the rest is truncated away
  (those writers apply their own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import random
import stat
import time

import structlog

from workers.persona.ledger_lines import (
    LedgerIdentity,
    find_answer,
    ledger_identity,
    ledger_snapshot,
)
from workers.persona.memory_spec import MemoryRequest, parse_request
from workers.persona.writes import open_regular, single_link, write_all

__all__ = [
    "MAX_QUEUE_BYTES",
    "QUEUE_SUFFIX",
    "SERVE_MARGIN",
    "Handoff",
    "QueuedWrite",
    "enqueue",
    "is_handoff_key",
    "take",
]

QUEUE_SUFFIX = ".queue"
#: A queued write is applied by another writer only with at least this many seconds left
#: before its own writer's lock timeout.
SERVE_MARGIN = 2.0
#: The most queue bytes one holder reads (a 16 KiB entry fits 64 times).
MAX_QUEUE_BYTES = 1024 * 1024
_ACTIONS = frozenset({"add", "replace", "remove"})
#: How far past the size a taker saw it reads, for the appends that land meanwhile.
_TAKE_SLACK = 64 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW
_TAKE = os.O_RDWR | _NOFOLLOW
_READ = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW
#: Starts the keys made for unkeyed writes (a write key is hex digits: never the same).
_HANDOFF_PREFIX = "q"
#: The most ledger bytes one poll reads (the ledger's own bound).
_MAX_POLL_BYTES = 512 * 1024

_log = structlog.get_logger("soulfleet.memory")


@dataclasses.dataclass(frozen=True, slots=True)
class QueuedWrite:
    """One write another writer queued: its ledger key and the checked request."""

    key: str
    request: MemoryRequest


class Handoff:
    """One writer's side of the queue: it queues its write when the lock is taken
    (:meth:`enqueue`, path_lock's ``contended``) and, while it waits, watches the ledger for
    the holder's answer (:meth:`settled`, path_lock's ``settled``), so a served writer returns
    at once instead of waiting its turn at the lock just to read it."""

    def __init__(
        self, queue: str, ledger: str, request: MemoryRequest, key: str, timeout: float
    ) -> None:
        self.queue = queue
        self.ledger = ledger
        self.request = request
        #: The ledger key the write is answered under: its own key, or one made when queued.
        self.key = key
        self.until = None if timeout < 0 else time.time() + timeout
        self.queued = False
        #: Which ledger there was when the write was queued (None: none, or a turn's key that
        #: could not be looked for in it), for :meth:`untraceable`. No answer under the key
        #: was in it: one can only come after its size.
        self.queued_on: LedgerIdentity | None = None
        #: There was no ledger at all when the write was queued: the first one, created since,
        #: holds every answer until it is compacted.
        self.queued_before_ledger = False
        #: What the holder that applied the write answered (set by :meth:`settled`), or what
        #: an earlier attempt of the turn was answered (set by :meth:`enqueue`).
        self.answer: str | None = None
        self._seen: tuple[int, int] = (-1, 0)  # the ledger's (inode, bytes read so far)

    def enqueue(self) -> None:
        if self.until is not None and self.until - time.time() < SERVE_MARGIN:
            return  # no holder would apply it in time: this writer applies its own write
        key = self.key or f"{_HANDOFF_PREFIX}{random.getrandbits(124):031x}"
        try:
            if not self.key:  # made just now: nothing can have answered it yet
                queued_on = ledger_identity(self.ledger)
                before_ledger = queued_on is None
            else:
                # A turn's key: an earlier attempt of the turn may have applied this write.
                # Its answer then needs no lock (a retry answers as before), and if it is not
                # there, any answer comes after this read (what untraceable relies on).
                seen = ledger_snapshot(self.ledger)
                queued_on = None if seen is None else seen[0]
                # No snapshot: no ledger, or one too long to read whole.
                before_ledger = seen is None and ledger_identity(self.ledger) is None
                if seen is not None:
                    self.answer = find_answer(seen[1], key)
                    if self.answer is not None:
                        return  # settled: path_lock stops waiting, the write is not queued
            enqueue(self.queue, key, self.request, self.until)
        except OSError as exc:  # only an optimisation: the write is applied by its own writer
            _log.debug("memory.queue_failed", path=self.queue, error=str(exc))
            return
        self.key, self.queued, self.queued_on = key, True, queued_on
        self.queued_before_ledger = before_ledger
        if queued_on is not None:  # its answer can only come after this: read from here on
            self._seen = (queued_on.inode, queued_on.size)

    def untraceable(self, taken: list[QueuedWrite]) -> bool:
        """Whether this writer, now holding the lock with its answer not in the ledger, can no
        longer tell if its queued write was applied. Its entry left the queue without it (a
        holder took it, or a take dropped an append racing it), and the ledger was compacted
        in a way that may have dropped the answer: a writer stalled that long (a stopped
        process, a starved CPU) must not apply its write a second time.

        A missing answer still means the write was not applied (its holder died before the
        rename, left it to its own writer, or never read it) when the ledger is the one it
        queued on; and after one compaction of the ledger it queued on that kept every answer
        appended since it queued, since no answer under its key was in that ledger (a handoff
        key is made at enqueue; a turn's key :meth:`enqueue` looked for and did not find).
        Without this, a compaction during an ordinary wait turned ~1 in 25,000 contended adds
        into a false "may have been applied". With no ledger when it queued, the one created
        since holds every answer until its first compaction, which may have dropped it."""
        if not self.queued or any(write.key == self.key for write in taken):
            return False
        try:
            now = ledger_identity(self.ledger)
        except OSError:
            return True
        if now is None or now.same_ledger(self.queued_on):
            return False  # no ledger now, or the very one it queued on: nothing was dropped
        if self.queued_on is None:
            # Created since it queued and never compacted: every answer since is in it.
            return not (self.queued_before_ledger and now.since == "")
        kept_all = now.since == self.queued_on.generation != "" and (
            now.kept_from <= self.queued_on.size
        )
        return not kept_all

    def settled(self) -> bool:
        """Whether a holder applied the queued write: its answer is in the ledger. Reads only
        what was appended since the last look (one ``stat`` when nothing was)."""
        if self.answer is not None:
            return True
        if not self.queued:
            return False
        try:
            inode, size = _mark(self.ledger)
        except OSError:
            return False
        seen_inode, offset = self._seen
        if inode == seen_inode and size <= offset:
            return False
        start = offset if inode == seen_inode else 0  # compacted: a new file, read it all
        chunk = _read_from(self.ledger, start, inode)
        if chunk is None:
            return False
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being appended is read next time
        self._seen = (inode, start + len(whole))
        self.answer = find_answer(whole, self.key)
        return self.answer is not None


def is_handoff_key(key: str) -> bool:
    """Whether ``key`` was made for handing off an unkeyed write (not a turn's write key: its
    answer is read once, by its waiter, and never looked up again)."""
    return key.startswith(_HANDOFF_PREFIX)


def _mark(path: str) -> tuple[int, int]:
    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return (-1, 0)
    return info.st_ino, info.st_size


def _read_from(path: str, start: int, inode: int) -> bytes | None:
    try:
        fd = os.open(path, _READ)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_ino != inode:
            return None
        return os.pread(fd, _MAX_POLL_BYTES, start)
    except OSError:
        return None
    finally:
        os.close(fd)


def enqueue(path: str, key: str, request: MemoryRequest, until: float | None) -> None:
    """Append ``request`` (keyed ``key``; its writer waits until ``until``, wall clock, or
    forever for None) to the queue at ``path``, in one ``write``. Raises ``OSError``."""
    arguments = {"action": request.action, "target": request.target, "text": request.text}
    if request.action == "replace":
        arguments["with"] = request.with_
    record = {"key": key, "arguments": arguments, "collapsed": request.collapsed, "until": until}
    line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    # A FIFO at the queue's name must not block this writer for ever.
    fd = open_regular(path, _APPEND)
    try:
        write_all(fd, line)
    finally:
        os.close(fd)


def take(path: str, relative: str, max_entry_bytes: int) -> list[QueuedWrite]:
    """Empty the queue at ``path`` and return its writes for ``relative`` that are still worth
    applying, in queue order. Call only while holding the data file's lock. An unreadable or
    missing queue is an empty one (its writers apply their own writes)."""
    try:
        if os.stat(path, follow_symlinks=False).st_size == 0:
            return []
        fd = os.open(path, _TAKE)
    except OSError:
        return []
    try:
        # What is there, and room for appends landing meanwhile (a read of the whole bound
        # would allocate a megabyte per commit); whatever lies beyond is truncated away.
        info = os.fstat(fd)
        single_link(info, path)  # a planted hard link: never truncate the file it names
        raw = os.read(fd, min(MAX_QUEUE_BYTES, info.st_size + _TAKE_SLACK))
        os.ftruncate(fd, 0)
    except OSError as exc:
        if exc.errno == errno.EMLINK:  # its writers are refused too: the operator must hear
            _log.warning("memory.queue_unusable", path=path, error=str(exc))
        return []
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    now = time.time()
    taken: list[QueuedWrite] = []
    for line in raw.split(b"\n")[:-1]:  # the last piece is "" or a torn line
        queued = _parse(line, relative, max_entry_bytes, now)
        if queued is not None:
            taken.append(queued)
    return taken


def _parse(line: bytes, relative: str, max_entry_bytes: int, now: float) -> QueuedWrite | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    key, until = record.get("key"), record.get("until")
    if not (isinstance(key, str) and 0 < len(key) <= 64):
        return None
    if until is not None and not (isinstance(until, (int, float)) and until - now >= SERVE_MARGIN):
        return None
    # The same checks as the model's own arguments get (notes allowed: the target must be the
    # holder's own file anyway, so a notes-less tool never holds a note's lock).
    request = parse_request(record.get("arguments"), notes=True, max_entry_bytes=max_entry_bytes)
    if isinstance(request, str) or request.action not in _ACTIONS or request.relative != relative:
        return None
    if record.get("collapsed") is True:
        request = dataclasses.replace(request, collapsed=True)
    return QueuedWrite(key, request)

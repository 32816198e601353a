"""The locked part of a memory write: replay, edit, queued writes, durable write, ledger.

:mod:`workers.persona.memory` parses the call, resolves the target and takes the lock; this
module runs under it and decides what reaches the disk:

* **Settle, then replay.** A ledger ending with an intent (a holder that died between its
  write and its answers) is settled first (:mod:`workers.persona.ledger` says how). A write
  whose key the ledger already holds (a retried turn repeating it, or a queued write another
  holder applied) is answered from the ledger, nothing written.
* **Then the edit, then the queue.** The file is read once, the writer's own edit applied, and
  only then the queue taken (:mod:`workers.persona.write_queue`): as late as possible, so the
  writes queued while the previous holder's fsyncs ran join this one. Each queued write is
  applied in order on top, unless the ledger already holds its key; one that its edit refuses
  (text not found, over the cap) is left to its own writer, which gets that answer itself.
* **One durable write for all, under the lock.** When the new bytes only add to the file's
  end (an ``add``, or a batch of them) they are appended in place and flushed once
  (:func:`~workers.persona.writes.append_bytes` says when it may); otherwise they are fsynced,
  renamed and the directory fsynced. Either way before the lock is let go and before any
  answer is appended: a served waiter or a retried turn trusts an answer it reads, with no
  flush of its own, and the next holder's write never lands on a rename a crash could still
  undo. (Issue 15: the replace used to fsync its directory after the lock, overlapping the
  next holder; an append, which four writers of one file now pay instead, needs no directory
  fsync at all.) The intent is appended just before the append or the rename, the answers
  after the write is durable, each in one write.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from workers.persona.dream_log import LOG, rotate
from workers.persona.errors import PersonaError
from workers.persona.files import read_prefix
from workers.persona.home import MAX_FILE_BYTES
from workers.persona.ledger import WriteLedger
from workers.persona.memory_edit import FileFull, edit
from workers.persona.memory_paths import WriteTarget
from workers.persona.memory_spec import (
    MemoryRequest,
    is_unflushed,
    target_label,
    unflushed_message,
)
from workers.persona.tools import ToolResult
from workers.persona.write_queue import Handoff, QueuedWrite, is_handoff_key, take
from workers.persona.writes import append_bytes, fsync_directory, replace_bytes

__all__ = ["Committed", "commit"]

_log = structlog.get_logger("soulfleet.memory")


@dataclass(frozen=True, slots=True)
class Committed:
    """What a locked write did."""

    result: ToolResult
    #: The bytes written, or -1 when nothing was.
    size: int = -1
    #: The ledger's directory (it was created or compacted), to fsync after the lock ("" for
    #: none): the write itself is durable without it.
    flush_ledger: str = ""
    #: The caller's own keyed write is now applied (just now, or by an earlier attempt).
    applied: bool = False
    #: The caller's own edit was refused because the file is full (:class:`FileFull`).
    full: bool = False
    #: The file was replaced, but the directory fsync that makes it durable failed.
    unflushed: OSError | None = None

    @classmethod
    def replayed(cls, answer: str, *, applied: bool) -> Committed:
        """An answer another commit recorded (for a retried turn, or a served waiter): an
        error again if it said the write was applied but not flushed."""
        return cls(ToolResult(answer, is_error=is_unflushed(answer)), applied=applied)


def commit(
    target: WriteTarget,
    request: MemoryRequest,
    *,
    key: str,
    keyed: bool,
    max_entry_bytes: int,
    handoff: Handoff | None = None,
) -> Committed:
    """Run ``request`` against ``target`` while holding its lock. ``key`` is the ledger key it
    is answered under ("" for none); ``keyed`` says it is a turn's keyed write; ``handoff`` is
    the writer's side of the queue, if it may have queued the write before it got the lock."""
    ledger = WriteLedger(target.ledger)
    label = target_label(request.target)
    ledger.settle(target.data, label=label)  # a holder that died mid-commit: finish or void it
    if key:
        before = ledger.answer(key)
        if before is not None:  # a retry of this turn's write, or another writer applied it
            # (durable: every write is, directory and all, before its lock is let go)
            return Committed.replayed(before, applied=keyed)
    current = read_prefix(target.data, MAX_FILE_BYTES)
    own = edit(request, current)
    rotated = False
    if isinstance(own, FileFull) and target.relative == LOG:
        # A dream log grown near the cap before it was rotated: archive its older lines now,
        # or the cap would refuse every pass's line forever and the rotation never run.
        trimmed = _trimmed_log(target, current)
        if trimmed is not None:
            current, rotated = trimmed, True
            own = edit(request, current)
    queued = take(target.queue, request.relative, max_entry_bytes)
    if handoff is not None and handoff.untraceable(queued):
        _log.warning("memory.handoff_untraceable", path=target.relative, key=key,
                     reason="the ledger was compacted while this writer waited")  # fmt: skip
        own = _untraceable(request)
    if keyed or queued:
        try:
            ledger.prepare()  # a ledger that cannot take the line refuses a keyed write
        except OSError:
            if keyed:
                raise
            queued = []  # their writers apply them themselves
    try:
        return _commit(
            target, own, current, key=key, keyed=keyed, ledger=ledger, queued=queued,
            rotated=rotated, label=label,
        )  # fmt: skip
    finally:
        ledger.close()


def _commit(
    target: WriteTarget,
    own: tuple[bytes, str] | str,
    current: bytes | None,
    *,
    key: str,
    keyed: bool,
    ledger: WriteLedger,
    queued: list[QueuedWrite],
    rotated: bool = False,
    label: str = "",
) -> Committed:
    """``rotated``: ``current`` is the dream log with its older lines just archived, to be
    written even if no edit applies (else they would be archived again). ``label``: the file
    as the model names it."""
    state = current if isinstance(own, str) else own[0]
    served: list[tuple[str, str]] = []
    # Keys this batch has seen: a turn's attempt killed while its write waited in the queue,
    # then its retry queuing the same write, leaves one key in the queue twice.
    seen = {key}
    for other in queued:
        if other.key in seen:
            continue  # our own entry, or a write already in this batch
        seen.add(other.key)
        # A handoff key is answered only by the holder that takes its entry from the queue,
        # and an entry is taken once: only a turn's write key can be applied already (by an
        # earlier attempt of the turn), so only those pay a look through the ledger.
        if not is_handoff_key(other.key) and ledger.answer(other.key) is not None:
            continue
        outcome = edit(other.request, state)
        if not isinstance(outcome, str):  # a refused write is left to its own writer
            state, message = outcome
            served.append((other.key, message))
    refused = isinstance(own, str)
    full = isinstance(own, FileFull)
    result = ToolResult(own, is_error=True) if isinstance(own, str) else ToolResult(own[1])
    if refused and not served and not rotated:
        return Committed(result, full=full)
    new = rotate(target.root, target.relative, state or b"")
    # The bytes on disk, if the commit may append to them ("rotated": what was read is gone).
    on_disk = None if rotated else current
    if not (keyed or served):
        unflushed = _write(target, on_disk, new)
        return Committed(result, len(new), full=full, unflushed=unflushed)
    answered = list(served)
    if keyed and not refused:
        answered.insert(0, (key, result.output))
    unflushed = _write(
        target, on_disk, new,
        before=lambda will_be, tail: ledger.intend(will_be, answered, tail=tail),
    )  # fmt: skip
    if unflushed is not None:
        # Applied, perhaps not durable: every writer of the batch (and a retry) hears that,
        # and none applies its write again.
        note = unflushed_message(label, unflushed)
        answered = [(answered_key, note) for answered_key, _ in answered]
    if served:
        _log.info("memory.queued_writes_applied", path=target.relative, writes=len(served))
    return Committed(
        result,
        len(new),
        flush_ledger=_record(ledger, answered) if answered else "",
        applied=keyed and not refused,
        full=full,
        unflushed=unflushed,
    )


def _write(
    target: WriteTarget,
    on_disk: bytes | None,
    new: bytes,
    *,
    before: Callable[[tuple[int, int], bytes], None] | None = None,
) -> OSError | None:
    """Make the data file hold ``new``, durably, before the lock is let go: appended in place
    when it only adds to ``on_disk`` and that is safe
    (:func:`~workers.persona.writes.append_bytes`: an ``add``, or a batch of them), else
    replaced and its directory fsynced. ``before`` gets what the file will be once written
    (inode, size) and the bytes an append adds (b"" for a replace), just before it is.
    Returns the directory fsync's error (the file was replaced, but the rename may not survive
    a crash of the machine), None when durable."""
    # Bytes that only extend the file are named in the intent either way (a replace of an add
    # that crossed a page, a hard-linked or network file): then a line appended after them
    # does not hide them from the next holder.
    added = new[len(on_disk) :] if on_disk is not None and new.startswith(on_disk) else b""
    told = None if before is None else lambda will_be: before(will_be, added)
    if append_bytes(target.data, on_disk, new, before_append=told):
        return None
    replace_bytes(target.data, new, before_rename=told)
    try:
        fsync_directory(target.directory)
    except OSError as error:
        return error
    return None


def _trimmed_log(target: WriteTarget, current: bytes | None) -> bytes | None:
    """The dream log ``current`` with its older lines archived (None: nothing moved; a log
    read cut at the cap is never rewritten from that cut)."""
    if current is None or len(current) > MAX_FILE_BYTES:
        return None
    trimmed = rotate(target.root, target.relative, current)
    return trimmed if len(trimmed) < len(current) else None


def _untraceable(request: MemoryRequest) -> str:
    label = target_label(request.target)
    return (
        f"this {request.action} was handed to the writer holding {label}'s lock while it "
        "waited, and whether that writer applied it is no longer on record (this writer was "
        f"held up for a long time meanwhile). It may have been applied: read {label} before "
        "you try again."
    )


def _record(ledger: WriteLedger, answered: list[tuple[str, str]]) -> str:
    """Record applied writes; the directory to fsync after the lock ("" for none)."""
    try:
        return os.path.dirname(ledger.path) if ledger.record_all(answered) else ""
    except (OSError, PersonaError) as exc:
        # The write itself succeeded: answer so. Only a retry could repeat it now.
        _log.warning("memory.ledger_failed", path=ledger.path, error=str(exc))
        return ""

"""The ``memory`` tool: a persona edits its own durable memory files (docs/persona.md §2).

Why it looks like this:

* **Disk, not the live prompt.** Every action writes the file; the soul of the running turn is a
  frozen snapshot, so the description tells the model its writes load next session.
* **Misuse is a result, never an exception.** The model reads every error message and must be able
  to act on it, so each names what was wrong and what to send instead; nothing is written.
* **Bytes in, bytes out.** Edits work on the file's bytes (:mod:`workers.persona.memory_edit`),
  so bytes the tool did not touch (including invalid UTF-8 a person left there) survive exactly.
  ``replace``/``remove`` act on the FIRST occurrence; an ``add`` is exactly one ``- text`` line,
  so newlines in its text are collapsed to single spaces (and the result says so). A ``remove``
  that leaves its line empty or a bare ``-`` drops that line too, so removed entries leave no
  husks behind.
* **Bounded.** One entry (``text`` of an add, ``with`` of a replace) is at most
  :data:`MAX_ENTRY_BYTES`; no edit may grow a file past :data:`MAX_FILE_BYTES`, the bootstrap cap,
  so what the tool writes is always what the next soul shows. A file a person grew past that cap
  is left alone (the tool reads at most the cap, so it cannot rewrite the rest safely).
* **Once per turn.** With a ``write_scope`` (a fleet turn's work id), each write is keyed and
  recorded in a small ledger under the same lock (:mod:`workers.persona.ledger`): a retried
  attempt of the turn that repeats a write gets the original answer, and nothing is applied
  twice. A ledger that cannot take the line (permissions) refuses the write before anything
  changes, rather than let a retry apply it again.
* **Safe writes.** Each write holds the path's lock (:mod:`workers.persona.locks`) across the
  read-modify-write and is durable before it lets the lock go: an ``add`` appends in place and
  flushes once, every other write replaces the file atomically (:mod:`workers.persona.writes`
  says when an append may be used: never where a reader could see part of it); the first write
  a tool makes to a file removes the temp files of writers killed mid-write; paths are confined
  to the persona directory, so a MEMORY.md or ``memory/`` that links outside is refused. Reads
  (``read``, ``list``) take no lock: they never see a torn file.
* **Short critical sections (issue 15).** An append needs one ``fdatasync`` and no rename, so
  no directory fsync; a replace fsyncs its data before the rename and the directory after it,
  both under the lock. A keyed write's ledger line is then appended without an fsync of its
  own (:mod:`workers.persona.ledger` says what that gives up: after a machine crash, a retry
  may repeat a write, never lose one). Paths are resolved once per target and only re-checked
  per call (:mod:`workers.persona.memory_paths`).
* **Contending writers share one commit (issue 15).** A writer that finds the
  lock taken queues its write (:mod:`workers.persona.write_queue`); the next holder applies the
  queue with its own write in one durable write (:mod:`workers.persona.memory_commit`) and
  then leaves each queued writer its answer in the ledger, where the waiter reads it without
  waiting for the lock and answers with no flush of its own. Anything not answered there, its
  writer applies itself.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from workers.persona.errors import LockTimeout, PersonaError
from workers.persona.files import confined, read_prefix
from workers.persona.home import MAX_FILE_BYTES, persona_home
from workers.persona.ledger import write_key
from workers.persona.locks import CLAIM_SUFFIX, DEFAULT_LOCK_TIMEOUT, LockMode, path_lock
from workers.persona.memory_commit import Committed, commit
from workers.persona.memory_edit import not_found
from workers.persona.memory_paths import TargetCache, WriteTarget
from workers.persona.memory_spec import (
    NOTES_DIR,
    MemoryRequest,
    describe,
    is_unflushed,
    parse_request,
    schema,
    target_label,
    unflushed_message,
    valid_note_slug,
)
from workers.persona.shared_claims import NO_LINKS
from workers.persona.tools import ToolResult
from workers.persona.write_queue import Handoff
from workers.persona.writes import TEMP_SUFFIX, fsync_directory, remove_stale_temps

__all__ = [
    "MAX_ENTRY_BYTES",
    "MemoryTool",
    "memory_tool",
    "set_write_failure_observer",
    "valid_note_slug",
]

#: The most bytes one entry (an add's ``text``, a replace's ``with``) may hold.
MAX_ENTRY_BYTES = 16 * 1024
_log = structlog.get_logger("soulfleet.memory")

_failure_observer: Callable[[str], None] | None = None


class MemoryTool:
    """The ``memory`` tool over one persona directory. Build it with :func:`memory_tool`."""

    source = "builtin"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        notes: bool = False,
        lock_mode: LockMode = "local",
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        write_scope: str | None = None,
    ) -> None:
        if lock_mode not in ("local", "shared"):
            raise ValueError(f"lock_mode must be 'local' or 'shared', got {lock_mode!r}")
        # Absolute now, so a later chdir cannot move the persona; resolved per call, so a
        # directory that appears (or vanishes) later is seen as it is then.
        self.path = Path(os.path.abspath(Path(path).expanduser()))
        self.notes = notes
        self.lock_mode: LockMode = lock_mode
        self.lock_timeout = lock_timeout
        # The turn's work id (a fleet turn sets it): writes are then keyed and recorded in a
        # ledger, so a retried attempt repeating them is answered as before, not applied twice.
        self.write_scope = write_scope
        self._applied: Counter[str] = Counter()
        self._targets = TargetCache()
        self._swept: set[str] = set()

    @property
    def name(self) -> str:
        return "memory"

    @property
    def description(self) -> str:
        return describe(notes=self.notes)

    @property
    def input_schema(self) -> dict[str, Any]:
        return schema(notes=self.notes)

    def __repr__(self) -> str:
        return f"MemoryTool({str(self.path)!r}, notes={self.notes}, lock_mode={self.lock_mode!r})"

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one action; every failure comes back as an error result, nothing raises."""
        request = parse_request(arguments, notes=self.notes, max_entry_bytes=MAX_ENTRY_BYTES)
        if isinstance(request, str):
            return ToolResult(request, is_error=True)
        try:
            if request.action in ("list", "read"):
                return self._look(persona_home(self.path), request)
            return self._write(request)
        except LockTimeout as error:
            self._failed(request, "lock_timeout", str(error))
            return ToolResult(_timeout_message(request, error), is_error=True)
        except PersonaError as error:
            self._failed(request, "persona_file", str(error))
            return ToolResult(f"{error}. Nothing was changed.", is_error=True)
        except OSError as error:
            message = _os_message(request, error)
            self._failed(request, "os_error", message)
            return ToolResult(message, is_error=True)

    def _failed(self, request: MemoryRequest, reason: str, error: str) -> None:
        # The model reads the error result, but the operator must hear of it too: a read-only
        # or full persona directory otherwise stops every memory write without a warning.
        write = request.action not in ("list", "read")
        _log.warning(
            "memory.write_failed" if write else "memory.read_failed",
            action=request.action,
            target=request.target,
            persona=str(self.path),
            reason=reason,
            error=error,
        )
        observer = _failure_observer
        if write and observer is not None:
            try:
                observer(reason)
            except Exception:  # a broken metrics hook must never break a memory write
                _log.exception("memory.observer_failed")

    def _look(self, root: Path, request: MemoryRequest) -> ToolResult:
        return self._list(root) if request.action == "list" else self._read(root, request)

    def _list(self, root: Path) -> ToolResult:
        directory = confined(root, NOTES_DIR)
        notes: list[tuple[str, int]] = []
        if directory.is_dir():
            with os.scandir(directory) as entries:
                for entry in entries:
                    # A note is a regular *.md file with a valid slug: lock files live in
                    # .locks/, temp files end in .tmp, and symlinks are not notes.
                    slug = entry.name[:-3] if entry.name.endswith(".md") else ""
                    if valid_note_slug(slug) and entry.is_file(follow_symlinks=False):
                        notes.append((slug, entry.stat(follow_symlinks=False).st_size))
        if not notes:
            return ToolResult('No notes yet. add with target "note:<slug>" creates one.')
        lines = [f"- note:{slug} ({size} bytes)" for slug, size in sorted(notes)]
        return ToolResult(f"{len(notes)} note(s):\n" + "\n".join(lines))

    def _read(self, root: Path, request: MemoryRequest) -> ToolResult:
        data = read_prefix(confined(root, request.relative), MAX_FILE_BYTES)
        label = target_label(request.target)
        if data is None:
            if request.target.startswith("note:"):
                return ToolResult(
                    f"{label} does not exist yet. Use list to see your notes; add creates one.",
                    is_error=True,
                )
            return ToolResult(f"{label} is empty.")
        text = data[:MAX_FILE_BYTES].decode("utf-8", "replace")
        if len(data) > MAX_FILE_BYTES:
            text += f"\n[read stops at {MAX_FILE_BYTES} bytes: the file is longer]"
        return ToolResult(text if text.strip() else f"{label} is empty.")

    def _sweep(self, data_path: str) -> None:
        """Remove the temp files writers killed mid-write left beside ``data_path`` (under its
        lock). Once per tool and file (each turn builds its own tool): scanning the persona
        directory on every write cost an add about 4% (issue 15)."""
        if data_path in self._swept:
            return
        stale = remove_stale_temps(data_path)
        self._swept.add(data_path)
        if stale:
            _log.warning("memory.stale_temps_removed", path=data_path, files=stale)

    def _write(self, request: MemoryRequest) -> ToolResult:
        keyed = self.write_scope is not None
        target = self._targets.locate(self.path, request, self.lock_mode)
        if target is None:
            return ToolResult(not_found(request), is_error=True)
        parts = (request.action, request.target, request.text, request.with_ or "")
        what = "\x00".join(parts) if keyed else ""
        key = ""
        if self.write_scope is not None:
            key = write_key(self.write_scope, *parts, ordinal=self._applied[what] + 1)
        handoff = Handoff(target.queue, target.ledger, request, key, self.lock_timeout)
        done = None
        try:
            with path_lock(
                target.lock, mode=self.lock_mode, timeout=self.lock_timeout,
                contended=handoff.enqueue, settled=handoff.settled,
            ) as held:  # fmt: skip
                if held:
                    self._sweep(target.data)
                    key = handoff.key
                    done = commit(
                        target, request, key=key, keyed=keyed,
                        max_entry_bytes=MAX_ENTRY_BYTES, handoff=handoff,
                    )  # fmt: skip
        except LockTimeout as error:
            self._failed(request, "lock_timeout", str(error))
            return ToolResult(_timeout_message(request, error, handoff.queued), is_error=True)
        if done is None:  # another writer applied it, durably, and left the answer
            answer = "" if handoff.answer is None else handoff.answer
            done = Committed.replayed(answer, applied=keyed)
        return self._settle(request, target, done, what)

    def _settle(
        self, request: MemoryRequest, target: WriteTarget, done: Committed, what: str
    ) -> ToolResult:
        """After the lock: report a full file, count the applied write, flush, log."""
        if done.full:
            self._failed(request, "full", done.result.output)
        if done.applied:
            self._applied[what] += 1
            if done.size < 0:
                _log.info("memory.write_replayed", action=request.action,
                          target=request.target, scope=self.write_scope)  # fmt: skip
        if done.flush_ledger:
            try:
                fsync_directory(done.flush_ledger)
            except OSError as exc:  # the write is durable: only a retry could repeat it now
                _log.warning("memory.ledger_failed", path=done.flush_ledger, error=str(exc))
        if done.unflushed is not None:
            return self._unflushed(request, done.result, done.unflushed)
        if done.result.is_error and is_unflushed(done.result.output):
            # Its write was applied by another writer whose flush failed (a replayed answer).
            self._failed(request, "os_error", done.result.output)
        if done.size >= 0:
            _log.info("memory.write", action=request.action, target=request.target,
                      path=target.relative, bytes=done.size)  # fmt: skip
        return done.result

    def _unflushed(self, request: MemoryRequest, result: ToolResult, error: OSError) -> ToolResult:
        """The write was made (the file shows it) but its directory fsync failed: say so."""
        message = unflushed_message(target_label(request.target), error)
        self._failed(request, "os_error", message)
        return result if result.is_error else ToolResult(message, is_error=True)


def _timeout_message(request: MemoryRequest, error: LockTimeout, queued: bool = False) -> str:
    holders = f" Its lock: {', '.join(error.holders)}." if error.holders else ""
    label = target_label(request.target)
    outcome = "Nothing was changed; try again in a moment."
    if queued:
        outcome = (
            "The write was handed to the writer holding the lock and may still be applied: "
            f"read {label} before you try again."
        )
    return (
        f"{label} is busy: its write lock ({error.path}, {error.mode} "
        f"mode) was not acquired within {error.timeout:g}s.{holders} {outcome} If it persists, "
        "an operator should follow ops/runbook.md 'Lock timeouts on a shared filesystem' (in "
        "shared lock mode, a claim left by a writer that crashed on another machine must be "
        "cleared with break_shared_lock)."
    )


def set_write_failure_observer(fn: Callable[[str], None] | None) -> None:
    """Call ``fn(reason)`` for every memory write that failed for a reason the operator must
    hear of: ``full`` (the file is at its size cap), ``os_error`` (read-only, no space, not
    permitted), ``lock_timeout``, ``persona_file``. A text not found is the model's own
    business and is not reported. None stops it."""
    global _failure_observer  # noqa: PLW0603
    _failure_observer = fn


def _os_message(request: MemoryRequest, error: OSError) -> str:
    # The failing path is often the hidden temp file or its rename; the model and the operator
    # need the file they know (MEMORY.md), and the real path where it adds something.
    path = os.fsdecode(error.filename2 or error.filename or "")
    shown = "" if not path or path.endswith(TEMP_SUFFIX) else f" ({path})"
    where = f"{target_label(request.target)}{shown}"
    hint = ""
    if error.errno in (errno.ENOSYS, errno.ENOLCK):
        hint = " This filesystem does not support flock: set SOULFLEET_LOCK_MODE=shared."
    elif error.errno in NO_LINKS and path.endswith(CLAIM_SUFFIX):
        hint = " This filesystem does not support hard links, which shared lock mode needs."
    problem = error.strerror or str(error)
    return f"could not {request.action} {where}: {problem}.{hint} Nothing was changed."


def memory_tool(
    path: str | os.PathLike[str],
    notes: bool = False,
    *,
    lock_mode: LockMode = "local",
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    write_scope: str | None = None,
) -> MemoryTool:
    """The ``memory`` tool over the persona directory at ``path`` (docs/persona.md §2).

    ``write_scope`` (the fleet passes the turn's work id) makes writes idempotent across
    retried attempts of one turn: see :mod:`workers.persona.ledger`.
    """
    return MemoryTool(
        path,
        notes=notes,
        lock_mode=lock_mode,
        lock_timeout=lock_timeout,
        write_scope=write_scope,
    )

"""The write queue: writes that find their file's lock taken are handed to the holder, applied
once in its durable replace and answered through the ledger; anything doubtful is left to its
own writer, so nothing is lost or applied twice."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.memory import held_by_thread, ok
from workers.persona import ledger as ledger_module
from workers.persona import memory_commit, write_queue
from workers.persona.ledger import WriteLedger, write_key
from workers.persona.ledger_lines import ledger_identity
from workers.persona.locks import lock_file_for, path_lock
from workers.persona.memory import MAX_ENTRY_BYTES, memory_tool
from workers.persona.memory_commit import commit
from workers.persona.memory_paths import TargetCache, WriteTarget
from workers.persona.memory_spec import MemoryRequest, parse_request
from workers.persona.tools import ToolResult
from workers.persona.write_queue import Handoff, enqueue, is_handoff_key, take

_ADD = MemoryRequest("add", "self", "MEMORY.md", "queued entry")


def _queue(home: Path) -> Path:
    (home / ".locks").mkdir(exist_ok=True)
    return home / ".locks" / "MEMORY.md.queue"


def _until(seconds: float = 60.0) -> float:
    return time.time() + seconds


def _line(**record: object) -> bytes:
    return (json.dumps(record) + "\n").encode()


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


# --- the queue file --------------------------------------------------------------------------


def test_take_returns_queued_writes_in_order_and_empties_the_queue(home: Path) -> None:
    """What writers queued comes back checked and in order; the queue is left empty."""
    queue = str(_queue(home))
    enqueue(queue, "qa", _ADD, _until())
    replace = MemoryRequest("replace", "self", "MEMORY.md", "queued", "kept")
    enqueue(queue, "qb", replace, None)
    collapsed = MemoryRequest("add", "self", "MEMORY.md", "two lines", collapsed=True)
    enqueue(queue, "qc", collapsed, _until())
    taken = take(queue, "MEMORY.md", MAX_ENTRY_BYTES)
    assert [(q.key, q.request) for q in taken] == [("qa", _ADD), ("qb", replace), ("qc", collapsed)]
    assert os.path.getsize(queue) == 0
    assert take(queue, "MEMORY.md", MAX_ENTRY_BYTES) == []


def test_take_ignores_lines_that_fail_the_checks(home: Path) -> None:
    """A queue line is checked as the model's arguments are: anything malformed, for another
    file, oversized, expired or torn is left out (its writer applies its own write)."""
    queue = _queue(home)
    good = {"action": "add", "text": "good"}
    lines = [
        b"not json\n",
        b"[1, 2]\n",
        _line(arguments=good, until=None),  # no key
        _line(key="k" * 65, arguments=good, until=None),
        _line(key="k1", arguments={"action": "add", "text": "x", "target": "user"}, until=None),
        _line(key="k2", arguments={"action": "read"}, until=None),
        _line(key="k3", arguments={"action": "add", "text": "   "}, until=None),
        _line(key="k4", arguments={"action": "add", "text": "x" * (MAX_ENTRY_BYTES + 1)}),
        _line(key="k5", arguments=good, until=time.time() + 1.0),  # under the serve margin
        _line(key="k6", arguments={"action": "add", "text": "x", "bogus": 1}, until=None),
        _line(key="ok", arguments=good, until=None),
        b'{"key": "torn", "arguments": {"action": "add", "te',
    ]
    queue.write_bytes(b"".join(lines))
    taken = take(str(queue), "MEMORY.md", MAX_ENTRY_BYTES)
    assert [q.key for q in taken] == ["ok"]
    assert queue.stat().st_size == 0


def test_take_reads_a_bounded_amount(home: Path) -> None:
    """At most MAX_QUEUE_BYTES are read; the rest is dropped with the queue."""
    queue = str(_queue(home))
    entry = MemoryRequest("add", "self", "MEMORY.md", "x" * 8000)
    for index in range(200):  # ~1.6 MB
        enqueue(queue, f"q{index}", entry, None)
    taken = take(queue, "MEMORY.md", MAX_ENTRY_BYTES)
    assert 0 < len(taken) < 200
    assert [q.key for q in taken] == [f"q{index}" for index in range(len(taken))]
    assert os.path.getsize(queue) == 0


def test_a_symlinked_queue_is_neither_read_nor_written_through(home: Path, tmp_path: Path) -> None:
    """A queue path that is a symlink (to outside the persona) is refused both ways."""
    outside = tmp_path / "outside.txt"
    outside.write_bytes(_line(key="evil", arguments={"action": "add", "text": "x"}, until=None))
    queue = _queue(home)
    queue.symlink_to(outside)
    assert take(str(queue), "MEMORY.md", MAX_ENTRY_BYTES) == []
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        enqueue(str(queue), "qa", _ADD, None)
    assert outside.read_bytes().count(b"\n") == 1  # untouched


def test_a_hard_linked_queue_is_neither_taken_nor_truncated(home: Path, tmp_path: Path) -> None:
    """A queue that is a hard link to a file elsewhere: `take` (at every memory write)
    truncated that file to nothing. It is left whole, and read as an empty queue."""
    outside = tmp_path / "outside.txt"
    outside.write_bytes(_line(key="evil", arguments={"action": "add", "text": "x"}, until=None))
    queue = _queue(home)
    queue.parent.mkdir(parents=True, exist_ok=True)
    os.link(outside, queue)
    before = outside.read_bytes()
    with capture_logs() as logs:
        assert take(str(queue), "MEMORY.md", MAX_ENTRY_BYTES) == []
    assert [entry["event"] for entry in logs] == ["memory.queue_unusable"]
    with pytest.raises(OSError, match="hard links"):
        enqueue(str(queue), "qa", _ADD, None)
    assert outside.read_bytes() == before


# --- the waiting writer's side ---------------------------------------------------------------


def test_handoff_settles_on_an_answer_recorded_after_it_queued(home: Path) -> None:
    """A waiter reads only what the ledger gained since it queued, and settles on its key."""
    ledger = WriteLedger(home / ".locks" / "MEMORY.md.applied")
    (home / ".locks").mkdir()
    ledger.record("earlier", "an older answer")
    handoff = Handoff(str(_queue(home)), str(ledger.path), _ADD, "", timeout=30)
    handoff.enqueue()
    assert handoff.queued
    assert handoff.key.startswith("q")
    assert not handoff.settled()
    WriteLedger(ledger.path).record("someone-else", "not ours")
    assert not handoff.settled()
    WriteLedger(ledger.path).record(handoff.key, "Added an entry to MEMORY.md.")
    assert handoff.settled()
    assert handoff.answer == "Added an entry to MEMORY.md."


def test_handoff_reads_a_compacted_ledger_whole(home: Path) -> None:
    """A ledger replaced by compaction (a new inode) is read from its start."""
    (home / ".locks").mkdir()
    path = home / ".locks" / "MEMORY.md.applied"
    WriteLedger(path).record("first", "x" * 200)
    handoff = Handoff(str(_queue(home)), str(path), _ADD, "", timeout=30)
    handoff.enqueue()
    replacement = home / ".locks" / "new"
    replacement.write_text(json.dumps({"key": handoff.key, "message": "done"}) + "\n")
    os.replace(replacement, path)
    assert handoff.settled()
    assert handoff.answer == "done"


def test_a_writer_with_too_little_time_left_does_not_queue(home: Path) -> None:
    """With less than the serve margin left, nobody would apply it: nothing is queued."""
    handoff = Handoff(str(_queue(home)), str(home / "ledger"), _ADD, "", timeout=1.0)
    handoff.enqueue()
    assert not handoff.queued
    assert not _queue(home).exists()


# --- through the memory tool -----------------------------------------------------------------


def _memory_lock(home: Path) -> Path:
    return lock_file_for(home, home.resolve() / "MEMORY.md")


def _queued_lines(home: Path) -> int:
    queue = _queue(home)
    return queue.read_bytes().count(b"\n") if queue.exists() else 0


def _queue_two_behind_a_held_lock(home: Path, write: Callable[[str], None]) -> None:
    """Run ``write("b")`` and ``write("c")`` on two threads that both queue behind a held
    lock, then let the lock go and wait for both."""
    writers = [threading.Thread(target=write, args=(text,)) for text in ("b", "c")]
    try:
        with held_by_thread(_memory_lock(home)):
            writers[0].start()
            _wait_for(lambda: _queued_lines(home) == 1, "the first writer to queue")
            writers[1].start()
            _wait_for(lambda: _queued_lines(home) == 2, "the second writer to queue")
    finally:
        for writer in writers:
            writer.join(10)


def test_a_waiting_writer_is_served_by_the_next_holder(home: Path) -> None:
    """Two writers queue behind a held lock; whichever gets it applies both in one write and
    the other returns the answer it left in the ledger. Each entry lands once."""
    ok(memory_tool(home), action="add", text="before")
    results: dict[str, str] = {}

    def write(text: str) -> None:
        results[text] = memory_tool(home).execute({"action": "add", "text": text}).output

    _queue_two_behind_a_held_lock(home, write)
    added = "Added an entry to MEMORY.md. It loads into your system prompt at the start of your "
    assert results == dict.fromkeys(("b", "c"), added + "next session.")
    lines = (home / "MEMORY.md").read_text().splitlines()
    assert sorted(lines) == ["- b", "- before", "- c"]
    applied = home / ".locks" / "MEMORY.md.applied"
    ledger = [json.loads(line) for line in applied.read_text().splitlines()]
    answers = [line for line in ledger if "key" in line]
    assert len(answers) == 1  # one writer was answered through the ledger
    assert answers[0]["key"].startswith("q")
    assert "intent" in ledger[-2]  # written before the batch's rename
    assert _queue(home).stat().st_size == 0


def test_a_write_taken_by_a_holder_that_died_is_applied_by_its_own_writer(home: Path) -> None:
    """A holder that took the queue and died before writing leaves no answer: the waiter
    applies its write itself, once."""
    result: list[str] = []

    def write() -> None:
        result.append(memory_tool(home).execute({"action": "add", "text": "mine"}).output)

    writer = threading.Thread(target=write)
    try:
        with held_by_thread(_memory_lock(home)):
            writer.start()
            _wait_for(lambda: _queued_lines(home) == 1, "the writer to queue")
            assert len(take(str(_queue(home)), "MEMORY.md", MAX_ENTRY_BYTES)) == 1  # then "dies"
    finally:
        writer.join(10)
    assert result[0].startswith("Added an entry to MEMORY.md")
    assert (home / "MEMORY.md").read_text() == "- mine\n"


def test_a_queued_write_the_ledger_already_holds_is_not_applied_again(home: Path) -> None:
    """A retried turn that queues a write its first attempt applied: the holder skips it."""
    keyed = memory_tool(home, write_scope="ava:1")
    ok(keyed, action="add", text="once")
    key = write_key("ava:1", "add", "self", "once", "", ordinal=1)
    enqueue(str(_queue(home)), key, MemoryRequest("add", "self", "MEMORY.md", "once"), None)
    ok(memory_tool(home), action="add", text="other")
    assert (home / "MEMORY.md").read_text() == "- once\n- other\n"


def test_a_refused_own_write_still_applies_the_queued_ones(home: Path) -> None:
    """The holder's own write can fail (text not found) while a queued add succeeds: the
    holder gets its error, the queued write is applied and answered."""
    ok(memory_tool(home), action="add", text="here")
    enqueue(str(_queue(home)), "qqueued", _ADD, _until())
    result = memory_tool(home).execute({"action": "remove", "text": "absent"})
    assert result.is_error
    assert "text not found" in result.output
    assert (home / "MEMORY.md").read_text() == "- here\n- queued entry\n"
    assert WriteLedger(home / ".locks" / "MEMORY.md.applied").answer("qqueued") == (
        "Added an entry to MEMORY.md. It loads into your system prompt at the start of your "
        "next session."
    )


def test_a_writer_that_times_out_after_queueing_says_it_may_still_be_applied(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its timeout message does not claim nothing changed; once its deadline has passed, no
    later holder applies it."""
    monkeypatch.setattr(write_queue, "SERVE_MARGIN", 0.1)
    with held_by_thread(_memory_lock(home)):
        result = memory_tool(home, lock_timeout=0.3).execute({"action": "add", "text": "late"})
    assert result.is_error
    assert "MEMORY.md is busy" in result.output
    assert "may still be applied" in result.output
    assert "Nothing was changed" not in result.output
    assert _queued_lines(home) == 1
    ok(memory_tool(home), action="add", text="next")
    assert (home / "MEMORY.md").read_text() == "- next\n"  # the expired entry was dropped


def test_shared_lock_mode_never_queues(home: Path) -> None:
    """O_APPEND is not whole across NFS clients: shared mode keeps no queue."""
    lock = lock_file_for(home, home.resolve() / "MEMORY.md", "shared")
    writer = threading.Thread(
        target=lambda: memory_tool(home, lock_mode="shared").execute({"action": "add", "text": "s"})
    )
    with held_by_thread(lock, "shared"):
        writer.start()
        time.sleep(0.2)  # the writer is waiting for the lock now
    writer.join(10)
    assert (home / "MEMORY.md").read_text() == "- s\n"
    assert not _queue(home).exists()


# --- when the batch's rename is made durable -------------------------------------------------


class _Flushes:
    """Records each flush of MEMORY.md's data or of its directory: which, on which thread,
    whether the write lock of MEMORY.md was free at that moment, and whether the ledger held
    ``answer_key`` yet."""

    def __init__(self, home: Path, monkeypatch: pytest.MonkeyPatch, answer_key: str) -> None:
        self.lock = _memory_lock(home)
        self.ledger = home.resolve() / ".locks" / "MEMORY.md.applied"
        self.answer_key = answer_key
        self.calls: list[tuple[str, int, bool, bool]] = []
        for name in ("fsync", "fdatasync"):  # a file's or a directory's: named by its descriptor
            real = getattr(os, name)

            def flush(fd: int, real: Callable[[int], None] = real) -> None:
                self._note(os.readlink(f"/proc/self/fd/{fd}"))
                real(fd)

            monkeypatch.setattr(os, name, flush)

    def _note(self, path: str) -> None:
        answered = WriteLedger(self.ledger).answer(self.answer_key) is not None
        self.calls.append((path, threading.get_ident(), self._lock_free(), answered))

    def _lock_free(self) -> bool:
        fd = os.open(self.lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing lets go of a lock this probe took
        return True

    def of(self, path: Path) -> list[tuple[int, bool, bool]]:
        return [(t, free, answered) for p, t, free, answered in self.calls if p == str(path)]


@pytest.mark.parametrize("how", ["append", "replace"])
@pytest.mark.parametrize("queued_key", ["qqueued", write_key("ava:2", "a turn's", ordinal=1)])
@pytest.mark.parametrize("scope", [None, "ava:1"])
def test_a_batch_is_durable_before_its_answers_and_its_lock(
    home: Path, monkeypatch: pytest.MonkeyPatch, how: str, queued_key: str, scope: str | None
) -> None:
    """A batch (a handoff write, or a turn's keyed write, queued; the holder's own keyed or
    not) makes its bytes durable under the lock, before any answer reaches the ledger: an
    append flushes the file (no directory fsync: no rename), a replace fsyncs the directory
    after its rename. A waiter or a retry that reads an answer can trust it, and nobody
    flushes after the lock."""
    ok(memory_tool(home), action="add", text="before")
    if how == "replace":
        monkeypatch.setattr(memory_commit, "append_bytes", lambda *args, **kwargs: False)
    enqueue(str(_queue(home)), queued_key, _ADD, _until())
    flushes = _Flushes(home, monkeypatch, queued_key)
    ok(memory_tool(home, write_scope=scope), action="add", text="own")
    assert (home / "MEMORY.md").read_text() == "- before\n- own\n- queued entry\n"
    data, directory = home.resolve() / "MEMORY.md", home.resolve()
    flushed = [(free, answered) for _, free, answered in flushes.of(data)]
    synced = [(free, answered) for _, free, answered in flushes.of(directory)]
    if how == "append":
        assert (flushed, synced) == ([(False, False)], [])
    else:  # the temp file's fsync is of another name
        assert (flushed, synced) == ([], [(False, False)])
    assert WriteLedger(flushes.ledger).answer(queued_key) is not None


@pytest.mark.parametrize("scope", [None, "ava:1"])
def test_a_batch_whose_directory_fsync_fails_tells_every_writer_it_was_changed(
    home: Path, monkeypatch: pytest.MonkeyPatch, scope: str | None
) -> None:
    """A replaced batch whose directory fsync fails (EIO) was applied: the holder and each
    queued writer hear "changed, do not repeat it" (an error), never "nothing was changed"
    (the model would add it again); a keyed holder's retry replays the same error."""
    ok(memory_tool(home), action="add", text="before")
    monkeypatch.setattr(memory_commit, "append_bytes", lambda *args, **kwargs: False)
    enqueue(str(_queue(home)), "qqueued", _ADD, _until())

    def failing(directory: str | os.PathLike[str]) -> None:
        raise OSError(errno.EIO, "Input/output error", os.fspath(directory))

    monkeypatch.setattr(memory_commit, "fsync_directory", failing)
    result = memory_tool(home, write_scope=scope).execute({"action": "add", "text": "own"})
    assert result.is_error
    assert result.output.startswith("MEMORY.md was changed, but flushing it to disk failed")
    assert (home / "MEMORY.md").read_text() == "- before\n- own\n- queued entry\n"
    answer = WriteLedger(home.resolve() / ".locks" / "MEMORY.md.applied").answer("qqueued")
    assert answer == result.output  # what its waiter returns, as an error (is_unflushed)
    if scope is not None:
        retry = memory_tool(home, write_scope=scope).execute({"action": "add", "text": "own"})
        assert (retry.is_error, retry.output) == (True, result.output)
        assert (home / "MEMORY.md").read_text().count("- own") == 1


def test_a_served_writer_answers_without_a_flush_of_its_own(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers queue behind a held lock; one applies both. The served one returns the
    answer it finds, with no flush: the holder made the batch durable before letting go."""
    ok(memory_tool(home), action="add", text="before")
    flushes = _Flushes(home, monkeypatch, "")
    threads: list[int] = []

    def write(text: str) -> None:
        threads.append(threading.get_ident())
        ok(memory_tool(home), action="add", text=text)

    _queue_two_behind_a_held_lock(home, write)
    assert sorted((home / "MEMORY.md").read_text().splitlines()) == ["- b", "- before", "- c"]
    flushed = flushes.of(home.resolve() / "MEMORY.md")
    assert [free for _, free, _ in flushed] == [False], flushes.calls  # one flush, locked
    assert len({thread for _, thread, _, _ in flushes.calls if thread in threads}) == 1


def test_a_keyed_write_queued_twice_is_applied_once(home: Path) -> None:
    """A turn's attempt killed while its write waited in the queue, then its retry queuing the
    same write under the same key: the holder that takes both applies it once."""
    ok(memory_tool(home), action="add", text="before")
    key = write_key("ava:7", "add", "self", "the turn's fact", "", ordinal=1)
    fact = MemoryRequest("add", "self", "MEMORY.md", "the turn's fact")
    for _attempt in range(2):
        enqueue(str(_queue(home)), key, fact, _until())
    ok(memory_tool(home), action="add", text="third writer")
    assert (home / "MEMORY.md").read_text() == "- before\n- third writer\n- the turn's fact\n"


def _stalled_writer(
    home: Path, text: str, key: str = ""
) -> tuple[WriteTarget, MemoryRequest, Handoff]:
    """A writer that queued ``text`` behind the lock and then stalled: its target, its
    request and its side of the queue, as the memory tool holds them (``key``: a turn's write
    key, "" for an unkeyed write)."""
    request = parse_request({"action": "add", "text": text}, notes=False, max_entry_bytes=64)
    assert isinstance(request, MemoryRequest)
    target = TargetCache().locate(home.resolve(), request, "local")
    assert target is not None
    handoff = Handoff(target.queue, target.ledger, request, key, 60.0)
    handoff.enqueue()
    assert handoff.queued
    return target, request, handoff


def _resume(target: WriteTarget, request: MemoryRequest, handoff: Handoff) -> ToolResult:
    """The stalled writer wakes up, finds the lock free and takes it, as path_lock would."""
    with path_lock(target.lock, timeout=5):
        return commit(
            target,
            request,
            key=handoff.key,
            keyed=not is_handoff_key(handoff.key),
            max_entry_bytes=64,
            handoff=handoff,
        ).result


def _drop_across_one_compaction(home: Path, target: WriteTarget, handoff: Handoff) -> None:
    """A take racing the stalled writer's append drops its entry unread, then 5 writes: with
    12 answers in the ledger before it queued and MAX_ENTRIES 8, the 5th compacts, keeping
    from "earlier 9" on: every answer since it queued."""
    Path(target.queue).write_bytes(b"")  # the racing take truncated the queue past the entry
    for index in range(5):
        ok(memory_tool(home, write_scope="later"), action="add", text=f"later {index}")
    identity = ledger_identity(target.ledger)
    assert identity is not None
    assert handoff.queued_on is not None
    assert identity.since == handoff.queued_on.generation  # compacted once since it queued


def test_a_stalled_writer_whose_answer_was_compacted_away_does_not_apply_it_again(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer stopped after a holder applied its queued write, while so many writes went by
    that the ledger was compacted and its answer dropped: when it resumes and gets the lock
    it cannot tell whether its write was applied, so it does not apply it again; it says the
    write may have been applied and to read the file first."""
    monkeypatch.setattr(ledger_module, "MAX_ENTRIES", 8)
    ok(memory_tool(home, write_scope="ava:1"), action="add", text="before")  # a ledger exists
    target, request, handoff = _stalled_writer(home, "stalled writer")
    ok(memory_tool(home), action="add", text="holder")  # applies the queued write, answers it
    for index in range(20):  # compacts the ledger to its newest 8 answers
        ok(memory_tool(home, write_scope="ava:2"), action="add", text=f"later {index}")
    assert not handoff.settled()
    result = _resume(target, request, handoff)
    assert result.is_error
    assert "may have been applied: read MEMORY.md before you try again" in result.output
    assert (home / "MEMORY.md").read_text().count("- stalled writer\n") == 1


def test_a_writer_whose_taken_write_went_unanswered_on_its_ledger_applies_it(home: Path) -> None:
    """The same writer when the ledger it queued on is still in place: no answer there means
    no holder applied the write (one took it and died), so it applies the write itself."""
    ok(memory_tool(home, write_scope="ava:1"), action="add", text="before")
    target, request, handoff = _stalled_writer(home, "mine")
    assert len(take(target.queue, "MEMORY.md", MAX_ENTRY_BYTES)) == 1  # the taker dies
    result = _resume(target, request, handoff)
    assert not result.is_error, result.output
    assert (home / "MEMORY.md").read_text() == "- before\n- mine\n"


def test_a_write_dropped_from_the_queue_across_a_compaction_that_kept_its_answers_is_applied(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take that read the queue just before this writer's append and truncated it just
    after drops the entry unread. When the ledger was compacted once meanwhile but kept every
    answer appended since the writer queued, a missing answer still proves the write was not
    applied: the writer applies it, instead of a false "may have been applied" (seen ~1 in
    25,000 adds of 4 processes to one file)."""
    monkeypatch.setattr(ledger_module, "MAX_ENTRIES", 8)
    for index in range(12):  # 12 answers: the 16th in the ledger makes the next write compact
        ok(memory_tool(home, write_scope="ava:1"), action="add", text=f"earlier {index}")
    target, request, handoff = _stalled_writer(home, "dropped")
    _drop_across_one_compaction(home, target, handoff)
    result = _resume(target, request, handoff)
    assert not result.is_error, result.output
    assert (home / "MEMORY.md").read_text().count("- dropped\n") == 1


def test_a_turns_retry_of_an_applied_write_answers_as_before_without_the_lock(
    home: Path,
) -> None:
    """A turn's retry finds the lock taken, and its write already applied by the turn's first
    attempt: it answers what the first attempt was answered, at once, without queueing the
    write or waiting for the lock (nor can a compaction drop that answer while it waits)."""
    first = ok(memory_tool(home, write_scope="ava:7"), action="add", text="the turn's fact")
    with held_by_thread(_memory_lock(home)):
        retry = memory_tool(home, write_scope="ava:7", lock_timeout=3)
        began = time.monotonic()
        again = retry.execute({"action": "add", "text": "the turn's fact"})
        waited = time.monotonic() - began
    assert not again.is_error, again.output
    assert again.output == first
    assert waited < 1.0  # answered while the lock was still held (lock_timeout is 3 s)
    assert not _queue(home).exists() or _queue(home).read_bytes() == b""
    assert (home / "MEMORY.md").read_text().count("- the turn's fact\n") == 1


def test_a_turns_write_dropped_from_the_queue_across_a_compaction_that_kept_its_answers_is_applied(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's write that was not applied when it queued (its key not in the ledger then),
    dropped from the queue by a racing take, across one compaction that kept every answer
    since: no answer means not applied, as for an unkeyed write, and it is applied once."""
    monkeypatch.setattr(ledger_module, "MAX_ENTRIES", 8)
    for index in range(12):
        ok(memory_tool(home, write_scope=f"filler:{index}"), action="add", text=f"earlier {index}")
    key = write_key("ava:9", "add", "self", "dropped", "", ordinal=1)
    target, request, handoff = _stalled_writer(home, "dropped", key)
    _drop_across_one_compaction(home, target, handoff)
    result = _resume(target, request, handoff)
    assert not result.is_error, result.output
    assert (home / "MEMORY.md").read_text().count("- dropped\n") == 1


def test_a_compaction_that_reused_the_ledgers_inode_is_still_seen(home: Path) -> None:
    """ext4 hands a freed inode number straight back: a ledger compacted (here: rewritten in
    place, as if it got its old inode back) without the stalled writer's answer must still
    count as compacted, by its new generation, and the write is not applied twice."""
    ok(memory_tool(home, write_scope="ava:1"), action="add", text="before")
    target, request, handoff = _stalled_writer(home, "stalled writer")
    ok(memory_tool(home), action="add", text="holder")  # applies the queued write, answers it
    ledger = Path(target.ledger)
    kept = [
        line
        for line in ledger.read_bytes().splitlines(keepends=True)
        if handoff.key.encode() not in line and not line.startswith(b'{"generation"')
    ]
    with ledger.open("r+b") as rewritten:
        rewritten.truncate(0)
        rewritten.write(b'{"generation": "' + b"1" * 16 + b'"}\n' + b"".join(kept))
    result = _resume(target, request, handoff)
    assert result.is_error
    assert (home / "MEMORY.md").read_text().count("- stalled writer\n") == 1


def test_a_write_refused_in_the_batch_that_created_the_ledger_is_applied_by_its_writer(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W queues a replace of text that only V's add, queued after it, brings; the holder (a
    turn's keyed write, so its commit creates the ledger) refuses W's and applies V's. W
    finds no answer in a ledger created since it queued and never compacted: not applied,
    so W applies its replace itself instead of saying it may have been applied."""
    (home / "MEMORY.md").write_text("")
    taking, go = threading.Event(), threading.Event()
    real_take = take

    def slow_take(*args: Any) -> Any:
        if not go.is_set():  # the holder, with its own write done and the queue not yet taken
            taking.set()
            go.wait(10)
        return real_take(*args)

    monkeypatch.setattr(memory_commit, "take", slow_take)
    results: dict[str, str] = {}

    def write(name: str, arguments: dict[str, str], scope: str | None = None) -> None:
        result = memory_tool(home, lock_timeout=30, write_scope=scope).execute(arguments)
        results[name] = ("ERROR " if result.is_error else "") + result.output

    holder = threading.Thread(
        target=write, args=("H", {"action": "add", "text": "holder"}, "ava:1")
    )
    replace = threading.Thread(
        target=write, args=("W", {"action": "replace", "text": "foo", "with": "bar"})
    )
    add = threading.Thread(target=write, args=("V", {"action": "add", "text": "foo"}))
    holder.start()
    try:
        assert taking.wait(10)
        assert not (home / ".locks" / "MEMORY.md.applied").exists()  # no ledger yet
        replace.start()
        _wait_for(lambda: _queued_lines(home) == 1, "W to queue")
        add.start()
        _wait_for(lambda: _queued_lines(home) == 2, "V to queue")
    finally:
        go.set()
        for thread in (holder, replace, add):
            if thread.ident is not None:
                thread.join(30)
    assert results["V"].startswith("Added"), results
    assert results["W"].startswith("Replaced"), results
    assert (home / "MEMORY.md").read_text() == "- holder\n- bar\n"


def test_a_queue_that_is_a_fifo_never_blocks_a_waiting_writer(home: Path) -> None:
    """`.locks/MEMORY.md.queue` made a FIFO with no reader: a writer finding the lock taken
    opened it to queue its write and blocked there forever (past its lock timeout and its
    turn's time: no timer interrupts an open). It is refused at once, as a symlink is."""
    queue = _queue(home)
    os.mkfifo(queue)
    outcome: list[BaseException | None] = []

    def queue_one() -> None:
        try:
            enqueue(str(queue), "qa", _ADD, None)
            outcome.append(None)
        except BaseException as exc:  # what the caller gets
            outcome.append(exc)

    worker = threading.Thread(target=queue_one, daemon=True)
    worker.start()
    worker.join(timeout=10)
    blocked = worker.is_alive()
    if blocked:  # free the thread: a reader lets its open return
        reader = os.open(queue, os.O_RDONLY | os.O_NONBLOCK)
        worker.join(timeout=10)
        os.close(reader)
    assert not blocked, "enqueue blocked on the FIFO"
    assert isinstance(outcome[0], OSError), outcome

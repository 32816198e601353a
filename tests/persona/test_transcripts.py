"""Durable per-lane transcripts: layout, restart survival, torn lines, growth bound, confinement."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from workers.persona import transcript_listings
from workers.persona.clock import VirtualClock
from workers.persona.errors import PersonaFileError, PersonaNotFound
from workers.persona.messages import Message, ToolCall
from workers.persona.reaper import Reaper
from workers.persona.transcripts import (
    ConversationInfo,
    FileTranscripts,
    TranscriptStore,
    valid_transcript_name,
    wait_pruned,
)

T0 = 1_700_000_000.0


def conversation(store: FileTranscripts, lane: str, cid: str, *texts: str) -> None:
    writer = store.open(lane, cid)
    for text in texts:
        writer.append(Message(role="user", content=text))


def test_file_store_implements_the_protocol(tmp_path: Path) -> None:
    """FileTranscripts is a TranscriptStore (what the dreamer and search take)."""
    assert isinstance(FileTranscripts(tmp_path), TranscriptStore)


def test_layout_header_and_records(tmp_path: Path) -> None:
    """One JSONL file per conversation under transcripts/<lane>/, a header then one line each."""
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, clock=clock)
    writer = store.open("ava", "turn1")
    clock.advance(2.5)
    writer.append(Message(role="user", content="hello"))
    call = ToolCall(id="c1", name="memory", arguments={"action": "add", "text": "x"})
    writer.append(Message(role="assistant", content="", tool_calls=(call,)))
    files = list((tmp_path / "transcripts" / "ava").iterdir())
    assert [f.name for f in files] == [f"{int(T0 * 1000):015d}-turn1.jsonl"]
    assert writer.path == files[0]
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert lines[0] == {"transcript": 1, "conversation": "turn1", "lane": "ava", "started_at": T0}
    assert lines[1] == {"at": T0 + 2.5, "message": {"role": "user", "content": "hello"}}
    assert lines[2]["message"]["tool_calls"][0]["arguments"] == {"action": "add", "text": "x"}


def test_open_alone_creates_no_file(tmp_path: Path) -> None:
    """A conversation's file appears with its first message; opening writes nothing."""
    store = FileTranscripts(tmp_path)
    store.open("ava", "empty")
    assert list((tmp_path / "transcripts" / "ava").iterdir()) == []
    assert store.conversations() == []


def test_a_lane_directory_removed_after_open_is_made_again(tmp_path: Path) -> None:
    """The first append creates the lane directory if it went away since open()."""
    store = FileTranscripts(tmp_path)
    writer = store.open("ava", "t1")
    (tmp_path / "transcripts" / "ava").rmdir()
    writer.append(Message(role="user", content="still here"))
    assert [r.message.content for r in store.messages("t1")] == ["still here"]


def test_messages_round_trip_in_order(tmp_path: Path) -> None:
    """messages() returns every appended message, in order, with its time and conversation."""
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, clock=clock)
    writer = store.open("ava", "t1")
    sent = [
        Message(role="user", content="what is on my plate?"),
        Message(role="assistant", content="", tool_calls=(ToolCall("c1", "memory", {}),)),
        Message(role="tool", content="ok", tool_call_id="c1", name="memory", is_error=True),
        Message(role="assistant", content="Dentist at 3."),
    ]
    for message in sent:
        writer.append(message)
        clock.advance(1)
    records = store.messages("t1")
    assert [r.message for r in records] == sent
    assert [r.at for r in records] == [T0, T0 + 1, T0 + 2, T0 + 3]
    assert {r.conversation for r in records} == {"t1"}


def test_transcripts_survive_a_new_instance(tmp_path: Path) -> None:
    """A new FileTranscripts over the same home (a restart) reads what the old one wrote."""
    conversation(FileTranscripts(tmp_path, clock=VirtualClock(T0)), "ava", "t1", "one", "two")
    again = FileTranscripts(tmp_path)
    assert [c.id for c in again.conversations()] == ["t1"]
    assert [r.message.content for r in again.messages("t1")] == ["one", "two"]


WRITER = """
import os, signal, sys
from workers.persona.messages import Message
from workers.persona.transcripts import FileTranscripts
store = FileTranscripts(sys.argv[1])
writer = store.open("ava", sys.argv[2])
for i in range(3):
    writer.append(Message(role="user", content=f"message {i} from pid {os.getpid()}"))
if sys.argv[3] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""

READER = """
import json, sys
from workers.persona.transcripts import FileTranscripts
store = FileTranscripts(sys.argv[1])
out = [[c.id, c.lane, [r.message.content for r in store.messages(c.id)]]
       for c in store.conversations()]
print(json.dumps(out))
"""


def test_a_process_writes_another_reads(tmp_path: Path) -> None:
    """What one OS process appended, another process reads back after it exited."""
    subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), "t1", "exit"], check=True)
    out = subprocess.run(
        [sys.executable, "-c", READER, str(tmp_path)], check=True, capture_output=True, text=True
    )
    [[cid, lane, contents]] = json.loads(out.stdout)
    assert (cid, lane) == ("t1", "ava")
    assert [c.split(" from ")[0] for c in contents] == ["message 0", "message 1", "message 2"]


def test_sigkilled_writer_loses_nothing_it_appended(tmp_path: Path) -> None:
    """A writer SIGKILLed right after its appends returned loses none of them."""
    argv = [sys.executable, "-c", WRITER, str(tmp_path), "t1", "kill"]
    done = subprocess.run(argv, check=False)
    assert done.returncode == -signal.SIGKILL
    assert len(FileTranscripts(tmp_path).messages("t1")) == 3


def test_torn_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    """A half-written last line is skipped with a structured warning; the rest reads fine."""
    store = FileTranscripts(tmp_path)
    writer = store.open("ava", "t1")
    writer.append(Message(role="user", content="kept"))
    with writer.path.open("ab") as handle:
        handle.write(b'{"at": 1.0, "message": {"role": "assis')
    with capture_logs() as logs:
        records = FileTranscripts(tmp_path).messages("t1")
    assert [r.message.content for r in records] == ["kept"]
    torn = [e for e in logs if e["event"] == "transcript.torn_line"]
    assert len(torn) == 1
    assert torn[0]["log_level"] == "warning"
    assert torn[0]["line"] == 3
    assert torn[0]["path"] == str(writer.path)


def test_bad_records_are_skipped_not_fatal(tmp_path: Path) -> None:
    """Garbage and wrong-shaped lines in the middle are skipped; later lines still read."""
    store = FileTranscripts(tmp_path)
    writer = store.open("ava", "t1")
    writer.append(Message(role="user", content="first"))
    with writer.path.open("ab") as handle:
        handle.write(b"not json\n[1, 2]\n")
        handle.write(b'{"at": "noon", "message": {"role": "user", "content": "x"}}\n')
        handle.write(b'{"at": 5, "message": {"role": "system", "content": "x"}}\n')
    writer.append(Message(role="assistant", content="last"))
    with capture_logs() as logs:
        records = store.messages("t1")
    assert [r.message.content for r in records] == ["first", "last"]
    events = sorted(e["event"] for e in logs)
    assert events == ["transcript.bad_record"] * 3 + ["transcript.torn_line"]


def test_resumed_conversation_starts_after_a_torn_tail(tmp_path: Path) -> None:
    """Reopening a conversation whose last line is torn puts the next record on its own line."""
    store = FileTranscripts(tmp_path)
    writer = store.open("ava", "t1")
    writer.append(Message(role="user", content="before the crash"))
    with writer.path.open("ab") as handle:
        handle.write(b'{"at": 1.0, "mess')
    resumed = FileTranscripts(tmp_path).open("ava", "t1")
    assert resumed.path == writer.path
    assert resumed.info == writer.info
    resumed.append(Message(role="assistant", content="after the crash"))
    contents = [r.message.content for r in FileTranscripts(tmp_path).messages("t1")]
    assert contents == ["before the crash", "after the crash"]


def test_conversations_are_oldest_first_across_lanes(tmp_path: Path) -> None:
    """conversations() lists every lane's conversations ordered by start time."""
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, clock=clock)
    conversation(store, "ava", "a1", "x")
    clock.advance(10)
    conversation(store, "ava-dreamer", "d1", "x")
    clock.advance(10)
    conversation(store, "ava", "a2", "x")
    assert FileTranscripts(tmp_path).conversations() == [
        ConversationInfo("a1", "ava", T0),
        ConversationInfo("d1", "ava-dreamer", T0 + 10),
        ConversationInfo("a2", "ava", T0 + 20),
    ]


def test_lanes_scope_reads_and_writes(tmp_path: Path) -> None:
    """A store built with lanes=[...] sees and writes only those lanes."""
    clock = VirtualClock(T0)
    everything = FileTranscripts(tmp_path, clock=clock)
    conversation(everything, "ava", "a1", "persona talk")
    conversation(everything, "ava-dreamer", "d1", "dream talk")
    scoped = FileTranscripts(tmp_path, lanes=["ava"])
    assert [c.id for c in scoped.conversations()] == ["a1"]
    assert scoped.messages("d1") == []
    with pytest.raises(ValueError, match="outside this store's lanes"):
        scoped.open("ava-dreamer", "d2")


def test_unknown_conversation_has_no_messages(tmp_path: Path) -> None:
    """messages() of an id that never existed (or was pruned) is empty, not an error."""
    assert FileTranscripts(tmp_path).messages("nope") == []


def test_growth_bound_prunes_the_oldest_of_that_lane_only(tmp_path: Path) -> None:
    """With max_conversations=3 a lane keeps its 3 newest files; other lanes are untouched."""
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, max_conversations=3, clock=clock)
    conversation(store, "other", "o1", "x")
    for n in range(6):
        clock.advance(1)
        conversation(store, "ava", f"t{n}", "x")
    ids = [c.id for c in FileTranscripts(tmp_path).conversations()]
    assert ids == ["o1", "t3", "t4", "t5"]
    assert wait_pruned(10)
    assert len(list((tmp_path / "transcripts" / "ava").iterdir())) == 3


def test_pruned_files_leave_the_store_at_once_and_the_disk_soon(tmp_path: Path) -> None:
    """The bound's new guarantee: a pruned conversation is gone from every listing the moment
    the new one is created, and from the disk once the background unlink ran."""
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, max_conversations=2, clock=clock)
    for n in range(4):
        clock.advance(1)
        conversation(store, "ava", f"t{n}", "x")
        assert [c.id for c in store.conversations()][-1] == f"t{n}"
        assert len(store.conversations()) == min(n + 1, 2)
        assert store.messages(f"t{n - 2}") == []
    assert wait_pruned(10)
    names = sorted(p.name for p in (tmp_path / "transcripts" / "ava").iterdir())
    assert [name.split("-", 1)[1] for name in names] == ["t2.jsonl", "t3.jsonl"]


class _HeldReaper(Reaper):
    """A pruner whose thread has not run yet: paths stay pending until release()."""

    def delete(self, paths: Iterable[str]) -> None:
        with self._cond:
            self.held = [*getattr(self, "held", []), *paths]
            self._pending.update(self.held)

    def release(self) -> None:
        with self._cond:
            self._pending.difference_update(self.held)
        Reaper.delete(self, self.held)


def test_a_lane_listed_again_before_the_unlink_leaves_the_pruned_file_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the prune and its unlink the file is still on disk; a listing taken then (the
    directory changed behind our back) must not count or return it."""
    held = _HeldReaper("test-held", on_done=transcript_listings.reaped)
    monkeypatch.setattr(transcript_listings, "REAPER", held)
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, max_conversations=2, clock=clock)
    for n in range(3):
        clock.advance(1)
        conversation(store, "ava", f"t{n}", "x")
    lane = tmp_path / "transcripts" / "ava"
    assert len(list(lane.iterdir())) == 3  # t0 pruned, its unlink held
    time.sleep(0.05)
    (lane / "README").write_text("a person's note")  # forces the next open to list again
    assert [c.id for c in FileTranscripts(tmp_path).conversations()] == ["t1", "t2"]
    clock.advance(1)
    conversation(FileTranscripts(tmp_path, max_conversations=2, clock=clock), "ava", "t3", "x")
    assert [c.id for c in FileTranscripts(tmp_path).conversations()] == ["t2", "t3"]
    held.release()
    assert held.wait(10)
    assert sorted(p.name.split("-", 1)[-1] for p in lane.iterdir()) == [
        "README",
        "t2.jsonl",
        "t3.jsonl",
    ]


def test_files_a_killed_process_left_over_the_bound_are_pruned_next(tmp_path: Path) -> None:
    """A process killed before its pruner ran leaves the lane over its bound on disk; the next
    conversation created there (by any process) prunes down to the bound again."""
    lane = tmp_path / "transcripts" / "ava"
    lane.mkdir(parents=True)
    for n in range(6):  # what a crash left: 6 files in a lane bounded at 3
        stamp = round((T0 + n) * 1000)
        (lane / f"{stamp:015d}-old{n}.jsonl").write_text(
            json.dumps({"at": T0 + n, "message": {"role": "user", "content": "x"}}) + "\n"
        )
    time.sleep(0.05)  # past the directory time of any listing cached by an earlier test
    clock = VirtualClock(T0 + 10)
    conversation(FileTranscripts(tmp_path, max_conversations=3, clock=clock), "ava", "new", "x")
    assert [c.id for c in FileTranscripts(tmp_path).conversations()] == ["old4", "old5", "new"]
    assert wait_pruned(10)
    assert len(list(lane.iterdir())) == 3


def test_resuming_does_not_prune(tmp_path: Path) -> None:
    """Appending to an existing conversation never deletes another one."""
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, max_conversations=2, clock=clock)
    conversation(store, "ava", "t1", "x")
    clock.advance(1)
    conversation(store, "ava", "t2", "x")
    conversation(store, "ava", "t1", "more")
    assert [c.id for c in store.conversations()] == ["t1", "t2"]
    assert [r.message.content for r in store.messages("t1")] == ["x", "more"]


def test_id_is_unique_across_lanes(tmp_path: Path) -> None:
    """A conversation id already used in one lane cannot be opened in another."""
    store = FileTranscripts(tmp_path)
    conversation(store, "ava", "t1", "x")
    with pytest.raises(ValueError, match="already used in lane 'ava'"):
        store.open("bob", "t1")


BAD_NAMES = ["", "../x", "a/b", "a\\b", ".x", "a..b", "..", "a b", "x" * 129, "é", "a\x00b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_lane_names_are_refused(tmp_path: Path, name: str) -> None:
    """Lane names with separators, traversal or odd characters are refused before any write."""
    with pytest.raises(ValueError, match="invalid lane"):
        FileTranscripts(tmp_path).open(name, "t1")
    assert not (tmp_path / "transcripts").exists()


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_conversation_ids_are_refused(tmp_path: Path, name: str) -> None:
    """Conversation ids with separators, traversal or odd characters are refused."""
    store = FileTranscripts(tmp_path)
    with pytest.raises(ValueError, match="invalid conversation id"):
        store.open("ava", name)
    with pytest.raises(ValueError, match="invalid conversation id"):
        store.messages(name)


@pytest.mark.parametrize("name", ["ava", "ava-dreamer", "0f3a9c", "a.b_c-d", "_x", "x" * 128])
def test_slug_names_are_accepted(name: str) -> None:
    """Ordinary lane names and uuid-hex ids are valid transcript names."""
    assert valid_transcript_name(name)


def test_symlink_leading_out_is_refused(tmp_path: Path) -> None:
    """A transcripts/ symlink leading outside the home is neither written through nor read."""
    home, outside = tmp_path / "ava", tmp_path / "elsewhere"
    home.mkdir()
    outside.mkdir()
    conversation(FileTranscripts(outside), "ava", "planted", "not ours")
    before = sorted(p.relative_to(outside) for p in outside.rglob("*"))
    (home / "transcripts").symlink_to(outside / "transcripts")
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        FileTranscripts(home).open("ava", "t1")
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before
    with capture_logs() as logs:
        assert FileTranscripts(home).conversations() == []
    assert [e["event"] for e in logs] == ["transcript.lane_refused"]


def test_symlinked_file_is_never_written_through(tmp_path: Path) -> None:
    """A conversation file replaced by a symlink is not followed on append."""
    target = tmp_path / "secret.txt"
    target.write_text("untouched")
    home = tmp_path / "ava"
    home.mkdir()
    store = FileTranscripts(home)
    writer = store.open("ava", "t1")
    writer.append(Message(role="user", content="x"))
    writer.path.unlink()
    writer.path.symlink_to(target)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        writer.append(Message(role="user", content="y"))
    assert target.read_text() == "untouched"


def test_missing_home_is_persona_not_found(tmp_path: Path) -> None:
    """A store over a directory that does not exist is PersonaNotFound."""
    with pytest.raises(PersonaNotFound):
        FileTranscripts(tmp_path / "nobody")


@pytest.mark.parametrize("bound", [0, -1])
def test_bound_must_be_positive(tmp_path: Path, bound: int) -> None:
    """max_conversations below 1 is refused."""
    with pytest.raises(ValueError, match="max_conversations"):
        FileTranscripts(tmp_path, max_conversations=bound)


def test_stray_files_in_lane_directories_are_ignored(tmp_path: Path) -> None:
    """Files that do not follow the naming scheme (notes, editor backups) are not conversations."""
    store = FileTranscripts(tmp_path, clock=VirtualClock(T0))
    conversation(store, "ava", "t1", "x")
    lane = tmp_path / "transcripts" / "ava"
    (lane / "README.txt").write_text("hi")
    (lane / "x-t2.jsonl").write_text("{}")
    (lane / "sub").mkdir()
    assert [c.id for c in FileTranscripts(tmp_path).conversations()] == ["t1"]


def test_deferred_sync_writes_at_once_and_syncs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In deferred mode (the fleet's, one fsync per turn) every append is in the file at once,
    readable by another store before any sync; sync() then costs one fsync of the file and one
    of the lane directory for the whole conversation, and the file reads back whole."""
    import os  # noqa: PLC0415

    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    store = FileTranscripts(tmp_path, clock=VirtualClock(T0))
    writer = store.open("ava", "turn1", sync_each=False)
    monkeypatch.setattr(os, "fsync", counting_fsync)
    for text in ("one", "two", "three"):
        writer.append(Message(role="user", content=text))
    assert synced == []
    reader = FileTranscripts(tmp_path)
    assert [r.message.content for r in reader.messages("turn1")] == ["one", "two", "three"]
    writer.sync()
    assert len(synced) == 2
    writer.sync()
    assert len(synced) == 2
    writer.close()
    assert [r.message.content for r in FileTranscripts(tmp_path).messages("turn1")] == [
        "one",
        "two",
        "three",
    ]


def test_killed_deferred_writer_loses_nothing_it_appended(tmp_path: Path) -> None:
    """A process SIGKILLed after appending in deferred mode, before any sync, lost nothing: the
    bytes were written to the file, only the fsync was pending."""
    code = (
        "import os, sys\n"
        "from workers.persona.messages import Message\n"
        "from workers.persona.transcripts import FileTranscripts\n"
        "w = FileTranscripts(sys.argv[1]).open('ava', 'killed', sync_each=False)\n"
        "for n in range(5):\n"
        "    w.append(Message(role='user', content=f'm{n}'))\n"
        "os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, timeout=60)
    assert done.returncode == -signal.SIGKILL
    got = [r.message.content for r in FileTranscripts(tmp_path).messages("killed")]
    assert got == [f"m{n}" for n in range(5)]


def test_listing_cache_sees_changes_made_by_others(tmp_path: Path) -> None:
    """A lane's listing is reused between turns, yet a file another process adds or removes
    is seen by the next open: pruning counts it and a resume finds it."""
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, max_conversations=3, clock=clock)
    conversation(store, "ava", "t1", "x")
    clock.advance(1)
    conversation(store, "ava", "t2", "x")
    lane = tmp_path / "transcripts" / "ava"
    # Another writer adds a conversation behind this process's back (an older one), a clock
    # tick after our own last change (directory times are as coarse as the kernel's tick).
    time.sleep(0.05)
    outside = lane / f"{round((T0 - 5) * 1000):015d}-outside.jsonl"
    outside.write_text(
        '{"transcript": 1, "conversation": "outside", "lane": "ava", "started_at": 1}\n'
        '{"at": 1, "message": {"role": "user", "content": "hi"}}\n'
    )
    os.utime(outside, (T0 - 5, T0 - 5))  # an old conversation, last written when it began
    clock.advance(1)
    conversation(FileTranscripts(tmp_path, max_conversations=3, clock=clock), "ava", "t3", "x")
    ids = [c.id for c in FileTranscripts(tmp_path).conversations()]
    assert ids == ["t1", "t2", "t3"]  # "outside" was the oldest: pruned to keep 3
    time.sleep(0.05)
    (lane / next(p.name for p in lane.iterdir() if "-t1." in p.name)).unlink()
    clock.advance(1)
    fresh = FileTranscripts(tmp_path, max_conversations=3, clock=clock)
    fresh.open("ava", "t2").append(Message(role="user", content="resumed"))
    assert [r.message.content for r in fresh.messages("t2")] == ["x", "resumed"]
    assert [c.id for c in FileTranscripts(tmp_path).conversations()] == ["t2", "t3"]


def test_a_conversation_still_being_written_outlives_newer_one_shots(tmp_path: Path) -> None:
    """The oldest conversation by start is a session still going on (written at every turn);
    newer one-shot conversations, each written once, fill the lane past its bound. Pruning
    drops the least recently written of the oldest, so the live session keeps its file (it
    was dropped for being the oldest: its next turn started a new file, its history gone)."""
    clock = VirtualClock(T0)
    store = FileTranscripts(tmp_path, max_conversations=3, clock=clock)
    conversation(store, "ava", "live", "my name is Bob")
    for n in range(4):
        clock.advance(1)
        time.sleep(0.02)  # one-shots written one after another, a kernel tick apart
        conversation(store, "ava", f"once{n}", "x")
        time.sleep(0.02)
        store.open("ava", "live").append(Message(role="user", content=f"turn {n}"))
    wait_pruned(5)
    ids = [c.id for c in FileTranscripts(tmp_path).conversations()]
    assert "live" in ids
    assert len(ids) == 3
    assert next(r.message.content for r in store.messages("live")) == "my name is Bob"


def test_a_transcript_hard_linked_to_another_file_is_not_appended_to(tmp_path: Path) -> None:
    """A conversation's file swapped for a hard link to a file elsewhere: its next message
    was appended to that file too. Refused (EMLINK) and the other file is untouched."""
    store = FileTranscripts(tmp_path)
    store.open("ava", "t1").append(Message(role="user", content="first"))
    [path] = (tmp_path / "transcripts" / "ava").iterdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious\n")
    path.unlink()
    os.link(outside, path)
    writer = store.open("ava", "t1")
    with pytest.raises(OSError, match="hard links"):
        writer.append(Message(role="user", content="second"))
    assert outside.read_bytes() == b"precious\n"

"""The answers a turn's work bought are kept per lane, so its retry replays them unpaid."""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog.testing

from tests.support.persona import heard_long_ago, make_persona
from workers.persona.call_log import CALLS_NAME, CallLog, call_key
from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.spend import nothing_new

TOOLS = (ToolSpec("memory", "your memory", {"type": "object"}),)
ASKED = (Message("user", "remember: genmaicha"),)
BOUGHT = Completion(
    "", (ToolCall("call_1", "memory", {"action": "add", "text": "tea"}),), Usage(900, 40), "tool"
)


def test_a_retry_of_the_same_work_replays_the_answer_unpaid(tmp_path: Path) -> None:
    """A second attempt (a new CallLog, as a retried turn builds) of the same work sending
    the same conversation and tools gets the bought answer back with zero usage."""
    home = make_persona(tmp_path / "ava")
    key = call_key(ASKED, TOOLS)
    CallLog(home, "ava", "ava:1:0").keep(key, BOUGHT)
    with structlog.testing.capture_logs() as logs:
        again = CallLog(home, "ava", "ava:1:0").recall(key)
    assert again is not None
    assert again.tool_calls == BOUGHT.tool_calls
    assert again.stop_reason == "tool"
    assert again.usage == BOUGHT.usage  # kept for the turn's budget; billed once only
    assert any(e["event"] == "model.call_replayed" for e in logs)


def test_another_conversation_or_tools_or_work_is_not_replayed(tmp_path: Path) -> None:
    """Only the same conversation and tools within the same work id are answered."""
    home = make_persona(tmp_path / "ava")
    key = call_key(ASKED, TOOLS)
    CallLog(home, "ava", "ava:1:0").keep(key, BOUGHT)
    assert CallLog(home, "ava", "ava:1:0").recall(call_key((Message("user", "hi"),), TOOLS)) is None
    assert CallLog(home, "ava", "ava:1:0").recall(call_key(ASKED, ())) is None
    later = CallLog(home, "ava", "ava:1:1")
    assert later.recall(key) is None
    later.keep("other", Completion("hello"))  # the next work starts the file anew
    assert CallLog(home, "ava", "ava:1:0").recall(key) is None
    assert CallLog(home, "ava", "ava:1:1").recall("other") is not None


def test_a_torn_line_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    """A crash mid-append tears the last line: the answers before it still replay, and the
    retry's next kept answer starts a line of its own (glued onto the fragment, it was lost
    to the retry after)."""
    home = make_persona(tmp_path / "ava")
    log = CallLog(home, "ava", "w")
    log.keep("a", Completion("first"))
    log.keep("b", Completion("second"))
    path = home / "sessions" / "ava" / CALLS_NAME
    path.write_bytes(path.read_bytes()[:-10])
    again = CallLog(home, "ava", "w")
    first = again.recall("a")
    assert first is not None
    assert first.text == "first"
    assert again.recall("b") is None
    again.keep("c", Completion("third"))
    kept = CallLog(home, "ava", "w").recall("c")
    assert kept is not None
    assert kept.text == "third"


def test_a_log_nested_past_the_recursion_limit_is_read_as_empty(tmp_path: Path) -> None:
    """A hand-made (or hostile) log whose header or answer line nests 100,000 deep raised
    RecursionError, which failed the lane's every turn until it was dead-lettered: it is a
    foreign file, read as nothing kept, and the next keep starts the log afresh."""
    home = make_persona(tmp_path / "ava")
    path = home / "sessions" / "ava" / CALLS_NAME
    path.parent.mkdir(parents=True)
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(deep + "\n")
    assert CallLog(home, "ava", "w").recall("a") is None
    path.write_text(json.dumps({"work": "w"}) + "\n" + '{"key": "a", "answer": ' + deep + "}\n")
    log = CallLog(home, "ava", "w")
    assert log.recall("a") is None
    log.keep("b", Completion("kept"))
    kept = CallLog(home, "ava", "w").recall("b")
    assert kept is not None
    assert kept.text == "kept"


def test_a_log_hard_linked_to_another_file_is_not_truncated_or_written(tmp_path: Path) -> None:
    """A lane's call log swapped for a hard link to a file elsewhere: a new work's first keep
    truncated that file and wrote the model's answers into it. The keep is dropped (a warning,
    as for any log that cannot be written) and the other file is untouched."""
    home = make_persona(tmp_path / "ava")
    CallLog(home, "ava", "w").keep("a", Completion("first"))
    path = home / "sessions" / "ava" / CALLS_NAME
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious\n")
    path.unlink()
    os.link(outside, path)
    CallLog(home, "ava", "w2").keep("b", Completion("second"))
    CallLog(home, "ava", "w").keep("c", Completion("third"))
    assert outside.read_bytes() == b"precious\n"


def test_a_log_that_cannot_be_written_only_costs_the_saving(tmp_path: Path) -> None:
    """A FIFO at the log's name (or any refusal): the keep is dropped with a warning, never
    blocks, never fails the call."""
    home = make_persona(tmp_path / "ava")
    (home / "sessions" / "ava").mkdir(parents=True)
    os.mkfifo(home / "sessions" / "ava" / CALLS_NAME)
    with structlog.testing.capture_logs() as logs:
        CallLog(home, "ava", "w").keep("a", Completion("x"))
    assert any(e["event"] == "model.call_not_kept" for e in logs)


def test_a_sessions_directory_leading_out_of_the_home_is_never_written(tmp_path: Path) -> None:
    """sessions/ symlinked outside the persona directory: nothing is written there."""
    home = make_persona(tmp_path / "ava")
    outside = tmp_path / "outside"
    outside.mkdir()
    (home / "sessions").symlink_to(outside)
    with structlog.testing.capture_logs() as logs:
        CallLog(home, "ava", "w").keep("a", Completion("x"))
    assert list(outside.rglob("*")) == []
    assert any(e["event"] == "model.call_not_kept" for e in logs)


def test_a_kept_answer_is_not_news_for_the_dreamer(tmp_path: Path) -> None:
    """A turn that bought an answer and then failed commits nothing: its call log in the
    lane's directory is no conversation for the dreamer to fold (a pass over nothing new)."""
    home = make_persona(tmp_path / "ava")
    last_pass = heard_long_ago(home, "ava")
    assert nothing_new(home, "ava", last_pass)
    CallLog(home, "ava", "w").keep("a", BOUGHT)
    assert nothing_new(home, "ava", last_pass)

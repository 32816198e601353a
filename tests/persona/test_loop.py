"""Tests for workers/persona/loop.py: the tool loop, its error results and its budget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.turns import Call, RecordingTool, ReplayModel, call, says
from workers.persona.clock import VirtualClock
from workers.persona.errors import ModelRateLimited, TurnAborted, TurnTimeUp
from workers.persona.loop import Budget, RunResult, run_loop
from workers.persona.messages import Completion, Message, ToolCall, Usage
from workers.persona.models.scripted import ScriptedModel
from workers.persona.tools import Tool, ToolResult
from workers.persona.turn_time import time_left


def loop(
    model: Any,
    *,
    tools: tuple[Tool, ...] = (),
    budget: Budget | None = None,
    clock: VirtualClock | None = None,
    on_message: Any = None,
    guard: Any = None,
    system: str = "## SOUL.md\n\nme",
    prompt: str = "hello",
) -> RunResult:
    return run_loop(
        system=system,
        prompt=prompt,
        tools=tools,
        model=model,
        budget=budget or Budget(),
        clock=clock or VirtualClock(),
        on_message=on_message,
        guard=guard,
    )


def roles(result: RunResult) -> list[str]:
    return [m.role for m in result.messages]


def test_plain_answer_is_done() -> None:
    """A model that answers without tools ends the turn "done" with its text."""
    model = ReplayModel(says("hi there", tokens=5))
    result = loop(model)
    assert (result.status, result.text, result.limit, result.error) == (
        "done",
        "hi there",
        None,
        None,
    )
    assert result.messages == (Message("user", "hello"), Message("assistant", "hi there"))
    assert result.usage == Usage(5, 0)
    assert result.model_calls == 1


def test_system_prompt_and_tools_reach_the_model_in_order() -> None:
    """The model gets the system prompt verbatim and the tool specs in the given order."""
    model = ReplayModel(says("ok"))
    loop(
        model,
        tools=(RecordingTool("b"), RecordingTool("a"), RecordingTool("c")),
        system="## SOUL.md\n\nexact",
    )
    assert model.calls[0].system == "## SOUL.md\n\nexact"
    assert model.calls[0].tools == ("b", "a", "c")


def test_several_tool_calls_in_one_message_run_in_order() -> None:
    """Calls in one assistant message run in the given order; each gets its own result."""
    order: list[str] = []

    def record(name: str) -> RecordingTool:
        def fn(args: Mapping[str, Any]) -> ToolResult:
            order.append(f"{name}:{args['n']}")
            return ToolResult(f"{name} did {args['n']}")

        return RecordingTool(name, fn=fn)

    model = ReplayModel(call(("a", {"n": 1}), ("b", {"n": 2}), ("a", {"n": 3})), says("finished"))
    result = loop(model, tools=(record("a"), record("b")))
    assert order == ["a:1", "b:2", "a:3"]
    assert roles(result) == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    tool_messages = [m for m in result.messages if m.role == "tool"]
    assert [(m.tool_call_id, m.name, m.content) for m in tool_messages] == [
        ("c0", "a", "a did 1"),
        ("c1", "b", "b did 2"),
        ("c2", "a", "a did 3"),
    ]
    assert result.tool_calls == 3
    assert result.text == "finished"
    # the second model call saw every tool result
    assert model.calls[1].messages == result.messages[:5]


def test_unknown_tool_is_an_error_result_the_model_sees() -> None:
    """A call to a tool that does not exist becomes an error result naming it and the tools."""
    model = ReplayModel(call(("nope", {})), says("sorry"))
    result = loop(model, tools=(RecordingTool("echo"),))
    error = result.messages[2]
    assert error.is_error
    assert "unknown tool 'nope'" in error.content
    assert "echo" in error.content
    assert result.status == "done"


def test_invalid_json_arguments_are_an_error_result_and_the_tool_is_not_run() -> None:
    """raw_arguments (not a JSON object) gives an error result; the tool never runs."""
    tool = RecordingTool("echo")
    bad = ToolCall("x1", "echo", {}, raw_arguments="{not json")
    result = loop(ReplayModel(call(bad), says("retry later")), tools=(tool,))
    error = result.messages[2]
    assert error.is_error
    assert error.tool_call_id == "x1"
    assert "'echo'" in error.content
    assert "not a JSON object" in error.content
    assert tool.seen == []


def test_a_tool_that_raises_is_an_error_result() -> None:
    """An exception from a tool becomes an error result with its type and message."""

    def boom(args: Mapping[str, Any]) -> ToolResult:
        raise RuntimeError("disk on fire")

    result = loop(
        ReplayModel(call(("boom", {})), says("ok")), tools=(RecordingTool("boom", fn=boom),)
    )
    error = result.messages[2]
    assert error.is_error
    assert "'boom' failed: RuntimeError: disk on fire" in error.content
    assert result.status == "done"


def test_a_tool_error_result_keeps_its_flag() -> None:
    """A ToolResult(is_error=True) from a tool reaches the transcript as an error message."""
    tool = RecordingTool("t", fn=lambda args: ToolResult("bad target", is_error=True))
    result = loop(ReplayModel(call(("t", {})), says("ok")), tools=(tool,))
    assert result.messages[2] == Message(
        "tool", "bad target", tool_call_id="c0", name="t", is_error=True
    )


def test_turn_aborted_from_a_tool_propagates() -> None:
    """TurnAborted raised inside a tool is never turned into a result."""

    def abort(args: Mapping[str, Any]) -> ToolResult:
        raise TurnAborted("lease lost")

    with pytest.raises(TurnAborted):
        loop(ReplayModel(call(("t", {})), says("ok")), tools=(RecordingTool("t", fn=abort),))


def test_guard_runs_before_every_tool_call_and_every_message() -> None:
    """guard() runs before each on_message and each tool call, in that interleaving."""
    events: list[str] = []

    def note(args: Mapping[str, Any]) -> ToolResult:
        events.append("tool")
        return ToolResult("r")

    tool = RecordingTool("t", fn=note)
    loop(
        ReplayModel(call(("t", {}), ("t", {})), says("done")),
        tools=(tool,),
        guard=lambda: events.append("guard"),
        on_message=lambda m: events.append(f"msg:{m.role}"),
    )
    assert events == [
        "guard",
        "msg:user",
        "guard",
        "msg:assistant",
        "guard",
        "tool",
        "guard",
        "msg:tool",
        "guard",
        "tool",
        "guard",
        "msg:tool",
        "guard",
        "msg:assistant",
    ]


def test_guard_raising_stops_before_the_next_write() -> None:
    """When guard raises TurnAborted, it propagates and the pending tool call does not run."""
    tool = RecordingTool("t")
    written: list[Message] = []
    state = {"allowed": 2}

    def guard() -> None:
        if state["allowed"] == 0:
            raise TurnAborted("lease lost")
        state["allowed"] -= 1

    with pytest.raises(TurnAborted):
        loop(
            ReplayModel(call(("t", {})), says("x")),
            tools=(tool,),
            guard=guard,
            on_message=written.append,
        )
    assert [m.role for m in written] == ["user", "assistant"]
    assert tool.seen == []


def test_on_message_sees_exactly_the_result_messages() -> None:
    """on_message receives every message of the turn, in the order of result.messages."""
    seen: list[Message] = []
    result = loop(
        ReplayModel(call(("t", {})), says("ok")),
        tools=(RecordingTool("t"),),
        on_message=seen.append,
    )
    assert tuple(seen) == result.messages
    assert roles(result) == ["user", "assistant", "tool", "assistant"]


def test_model_error_is_an_error_result_with_the_transcript_kept() -> None:
    """A ModelError ends the turn "error" with a clear message; messages so far are kept."""
    model = ReplayModel(call(("t", {})), ModelRateLimited("openai: 429 Too Many Requests"))
    result = loop(model, tools=(RecordingTool("t"),))
    assert result.status == "error"
    assert result.error is not None
    assert "ModelRateLimited" in result.error
    assert "429" in result.error
    assert roles(result) == ["user", "assistant", "tool"]
    assert result.limit is None


def test_usage_sums_over_model_calls() -> None:
    """usage is the sum of every completion's usage."""
    model = ReplayModel(call(("t", {}), tokens=10), says("ok", tokens=7))
    assert loop(model, tools=(RecordingTool("t"),)).usage == Usage(17, 0)


# --- budget --------------------------------------------------------------------------------------

FOREVER = ScriptedModel.from_rules(
    {"rules": [{"calls": [{"tool": "t", "args": {"n": "{tool_results}"}}]}]}
)


def test_max_model_calls() -> None:
    """A model that never stops is cut at max_model_calls, "incomplete", transcript whole."""
    result = loop(FOREVER, tools=(RecordingTool("t"),), budget=Budget(max_model_calls=3))
    assert (result.status, result.limit) == ("incomplete", "max_model_calls")
    assert result.model_calls == 3
    assert roles(result) == ["user"] + ["assistant", "tool"] * 3


def test_max_tool_calls_answers_the_unrun_calls() -> None:
    """Past max_tool_calls the remaining calls get "not run: budget" results; incomplete."""
    tool = RecordingTool("t")
    model = ReplayModel(call(("t", {"n": 1}), ("t", {"n": 2}), ("t", {"n": 3})), says("x"))
    result = loop(model, tools=(tool,), budget=Budget(max_tool_calls=2))
    assert (result.status, result.limit) == ("incomplete", "max_tool_calls")
    assert tool.seen == [{"n": 1}, {"n": 2}]
    last = result.messages[-1]
    assert last.role == "tool"
    assert last.tool_call_id == "c2"
    assert last.is_error
    assert last.content.startswith("not run: budget")
    assert roles(result) == ["user", "assistant", "tool", "tool", "tool"]
    assert len(model.calls) == 1


def test_max_tokens() -> None:
    """Once usage reaches max_tokens, the next model call is not made."""
    model = ReplayModel(call(("t", {}), tokens=60))
    result = loop(model, tools=(RecordingTool("t"),), budget=Budget(max_tokens=100))
    assert (result.status, result.limit) == ("incomplete", "max_tokens")
    assert len(model.calls) == 2
    assert result.usage.total_tokens == 120
    assert roles(result) == ["user", "assistant", "tool", "assistant", "tool"]


def test_a_budget_the_turns_calls_used_up_is_no_input_over_budget_alarm() -> None:
    """After model calls used the token budget, the next call not made is an ordinary end
    (``turn.token_budget_reached``, info), never the warning that the input alone is over the
    budget, which up's console showed as "no model call: its input alone is about 353,332
    tokens, over the turn's budget of 400,000" for a turn that had made calls. A soul over the
    budget still warns so."""
    with capture_logs() as logs:  # the soul (~50 tokens) fits; after a 60-token call it does not
        result = loop(ReplayModel(call(("t", {}), tokens=60)), tools=(RecordingTool("t"),),
                      system="x" * 200, budget=Budget(max_tokens=100))  # fmt: skip
    assert (result.limit, result.model_calls) == ("max_tokens", 1)
    assert [e["event"] for e in logs if "budget" in e["event"]] == ["turn.token_budget_reached"]
    assert next(e for e in logs if e["event"] == "turn.token_budget_reached")["used"] == 60
    with capture_logs() as logs:
        loop(ReplayModel(says("hi", tokens=5)), system="x" * 4_000, budget=Budget(max_tokens=900))
    assert [e["event"] for e in logs if "budget" in e["event"]] == ["turn.input_over_budget"]


def test_a_call_whose_input_alone_exceeds_the_token_budget_is_never_made() -> None:
    """A soul estimated (chars / 4) over max_tokens is not sent at all: the budget was only
    checked after a call, so a persona with a 3 MB MEMORY.md paid 524,904 tokens against a
    400,000 cap. Under the budget, the same soul is sent."""
    soul = "## MEMORY.md\n\n" + "x" * 4_000  # ~1,004 tokens
    model = ReplayModel(says("hi", tokens=5))
    result = loop(model, system=soul, budget=Budget(max_tokens=900))
    assert (result.status, result.limit, result.model_calls) == ("incomplete", "max_tokens", 0)
    assert model.calls == []
    assert loop(ReplayModel(says("hi", tokens=5)), system=soul,
                budget=Budget(max_tokens=1_200)).status == "done"  # fmt: skip


def test_each_model_call_is_told_the_time_the_turn_has_left() -> None:
    """While the model answers, time_left() is what is left of max_seconds (read on the turn's
    clock when the call starts), so the gate and the model client end their waits and tries by
    the turn's limit; there is none after each call, a raising one included."""
    clock = VirtualClock()
    seen: list[float | None] = []

    def answer(_: Call) -> Completion:
        seen.append(time_left())
        clock.advance(3.0)
        return call(("t", {})) if len(seen) == 1 else says("done")

    result = loop(ReplayModel(answer), tools=(RecordingTool("t"),), clock=clock,
                  budget=Budget(max_seconds=10.0))  # fmt: skip
    assert result.status == "done"
    assert seen == [pytest.approx(10.0, abs=0.5), pytest.approx(7.0, abs=0.5)]
    assert time_left() is None
    failed = loop(ReplayModel(ModelRateLimited("busy")), budget=Budget(max_seconds=10.0))
    assert failed.status == "error"
    assert time_left() is None


def test_a_model_call_cut_at_the_turns_limit_ends_the_turn_incomplete() -> None:
    """TurnTimeUp from the model (its tries ran into the turn's limit) ends the turn as the
    limit does between calls: incomplete, max_seconds, no error to retry."""
    result = loop(ReplayModel(TurnTimeUp("no time left")), budget=Budget(max_seconds=10.0))
    assert (result.status, result.limit) == ("incomplete", "max_seconds")
    assert result.model_calls == 0


def test_max_seconds_on_the_injected_clock() -> None:
    """Wall time is measured on the injected clock; past max_seconds the turn stops."""
    clock = VirtualClock()

    def slow(seen: Call) -> Completion:
        clock.advance(4.0)
        return call(("t", {}))

    result = loop(
        ReplayModel(slow), tools=(RecordingTool("t"),), clock=clock, budget=Budget(max_seconds=10.0)
    )
    assert (result.status, result.limit) == ("incomplete", "max_seconds")
    assert result.model_calls == 3
    assert roles(result)[-1] == "tool"


def test_budget_zero_model_calls_keeps_the_user_message() -> None:
    """Even a turn stopped before any model call keeps its user message."""
    result = loop(ReplayModel(says("x")), budget=Budget(max_model_calls=0))
    assert result.status == "incomplete"
    assert result.messages == (Message("user", "hello"),)


def test_incomplete_text_is_the_latest_text() -> None:
    """An incomplete turn's text is the latest assistant text seen."""
    model = ReplayModel(call(("t", {}), text="working on it"))
    result = loop(model, tools=(RecordingTool("t"),), budget=Budget(max_model_calls=1))
    assert result.text == "working on it"


def test_budget_rejects_negative_limits() -> None:
    """A negative limit is a programming error caught at construction."""
    with pytest.raises(ValueError, match="max_tool_calls"):
        Budget(max_tool_calls=-1)
    with pytest.raises(ValueError, match="max_seconds"):
        Budget(max_seconds=float("nan"))


def test_an_oversize_reply_is_cut_at_the_cap_before_anyone_sees_it() -> None:
    """A 20 MB answer reaches on_message (the transcript), the history and the result cut at
    max_reply_bytes (whole characters only) plus a notice naming the size and the cap."""
    seen: list[Message] = []
    huge = "é" * (10 * 1024 * 1024)  # 20 MB of two-byte characters
    result = loop(
        ReplayModel(says(huge)), budget=Budget(max_reply_bytes=1001), on_message=seen.append
    )
    assert result.status == "done"
    kept, notice = result.text.split("\n[truncated", 1)
    assert kept == "é" * 500  # 1000 bytes: the 1001st byte would split a character
    assert "20971520 bytes, over the 1001-byte reply cap" in notice
    assert seen[-1].content == result.text
    assert result.messages[-1].content == result.text


def test_a_tool_call_with_oversize_arguments_is_not_run_and_the_model_is_told() -> None:
    """Arguments over the cap: the tool never runs, the model gets an error result naming the
    size and the cap, and the recorded call no longer carries the arguments."""
    tool = RecordingTool()
    model = ReplayModel(call(("echo", {"text": "x" * 5000})), says("sorry"))
    result = loop(model, tools=(tool,), budget=Budget(max_reply_bytes=1000))
    assert tool.seen == []
    assert result.text == "sorry"
    assistant, answer = result.messages[1], result.messages[2]
    assert assistant.tool_calls[0].arguments == {}
    assert "x" * 1000 not in str(assistant.to_dict())
    assert answer.is_error
    assert "5012 bytes, over the 1000-byte reply cap; nothing was run" in answer.content


def test_a_reply_within_the_cap_is_untouched() -> None:
    """At exactly the cap nothing is cut and no notice is added."""
    result = loop(ReplayModel(says("y" * 1000)), budget=Budget(max_reply_bytes=1000))
    assert result.text == "y" * 1000

"""well_formed.py: a lone surrogate from a model or a tool becomes U+FFFD before it is stored."""

from __future__ import annotations

import json

from structlog.testing import capture_logs

from workers.persona.messages import Completion, ToolCall
from workers.persona.well_formed import well_formed, well_formed_completion

LONE = json.loads('"a \\ud800 b"')  # what JSON decoding of such a reply gives


def test_a_lone_surrogate_becomes_the_replacement_character_and_is_logged() -> None:
    """The repaired text encodes as UTF-8; the repair is logged without the text."""
    with capture_logs() as logs:
        repaired = well_formed(LONE, part="tool_result")
    assert repaired == "a \ufffd b"
    repaired.encode("utf-8")
    assert logs == [{"event": "turn.text_repaired", "part": "tool_result",
                     "lone_surrogates": 1, "log_level": "warning"}]  # fmt: skip


def test_well_formed_text_is_returned_as_is() -> None:
    """No copy and no log for ordinary text (astral characters included)."""
    text = "plain \U0001f600 text"
    with capture_logs() as logs:
        assert well_formed(text) is text
    assert logs == []


def test_every_string_of_a_completion_is_repaired() -> None:
    """Text, and the id, name, nested arguments (keys too) and raw arguments of tool calls."""
    call = ToolCall(id=LONE, name="memory", arguments={"text": LONE, LONE: [LONE, 1]})
    raw = ToolCall(id="c2", name="x", raw_arguments=LONE)
    repaired = well_formed_completion(Completion(text=LONE, tool_calls=(call, raw)))
    json.dumps([repaired.text, [c.to_dict() for c in repaired.tool_calls]]).encode("utf-8")
    first, second = repaired.tool_calls
    assert first.arguments == {"text": "a \ufffd b", "a \ufffd b": ["a \ufffd b", 1]}
    assert first.id == second.raw_arguments == repaired.text == "a \ufffd b"


def test_a_well_formed_completion_is_the_same_object() -> None:
    completion = Completion(text="ok", tool_calls=(ToolCall(id="1", name="t", arguments={}),))
    assert well_formed_completion(completion) is completion

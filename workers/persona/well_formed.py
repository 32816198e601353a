"""Text from outside made storable: a lone UTF-16 surrogate becomes U+FFFD.

Why: JSON may spell a lone surrogate (``"\\ud800"``), and Python decodes it into a ``str`` that
no UTF-8 encoder accepts. A model reply (or a tool's result) carrying one passed the loop, then
failed the transcript write with a bare ``UnicodeEncodeError``: a fleet turn was retried, each
retry a paid model call, until its lane was dead-lettered. Every completion and tool result is
therefore repaired where it enters the turn, before anything stores or encodes it; the repair
is logged ``turn.text_repaired`` (where, how many), never with the text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import structlog

from workers.persona.messages import Completion, ToolCall

__all__ = ["well_formed", "well_formed_completion"]

_log = structlog.get_logger("soulfleet.loop")
_LONE = re.compile("[\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


def well_formed(text: str, *, part: str = "text") -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (``text`` itself when it has none)."""
    if _LONE.search(text) is None:
        return text
    repaired, count = _LONE.subn(_REPLACEMENT, text)
    _log.warning("turn.text_repaired", part=part, lone_surrogates=count)
    return repaired


def _deep(value: Any, part: str) -> Any:
    if isinstance(value, str):
        return well_formed(value, part=part)
    if isinstance(value, Mapping):
        return {_deep(k, part): _deep(v, part) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_deep(item, part) for item in value]
    return value


def _call(call: ToolCall) -> ToolCall:
    raw = call.raw_arguments
    repaired = ToolCall(
        id=well_formed(call.id, part="tool_call"),
        name=well_formed(call.name, part="tool_call"),
        arguments=_deep(call.arguments, "tool_call"),
        raw_arguments=None if raw is None else well_formed(raw, part="tool_call"),
    )
    return call if repaired == call else repaired


def well_formed_completion(completion: Completion) -> Completion:
    """``completion`` with every string in its text and tool calls :func:`well_formed`."""
    text = well_formed(completion.text)
    calls = tuple(_call(call) for call in completion.tool_calls)
    same = all(a is b for a, b in zip(calls, completion.tool_calls, strict=True))
    if text is completion.text and same:
        return completion
    return replace(completion, text=text, tool_calls=calls)

"""The reply cap: no model reply larger than ``Budget.max_reply_bytes`` goes anywhere.

Why: a model (or a broken provider) can answer megabytes. The turn loop records every reply in
the transcript, the fleet commits the final text to Redis (``last_text``, a ``run`` caller's
reply, a surfaced beat) and hands tool-call arguments to tools. :func:`cap_completion` runs on
every completion before any of that: the text is cut at the cap on a character boundary with a
notice the model reads in its history, and a tool call whose arguments are larger is emptied and
marked, so the loop answers it with an error result instead of running it
(:func:`oversize_result`). Each cut is logged ``turn.reply_capped`` for the operator.
"""

from __future__ import annotations

import json
from dataclasses import replace

import structlog

from workers.persona.messages import Completion, ToolCall
from workers.persona.tools import ToolResult

__all__ = ["cap_completion", "oversize_result", "reply_cap_notice"]

_log = structlog.get_logger("soulfleet.loop")
#: raw_arguments of a call whose arguments the reply cap dropped: "<marker><size> bytes]".
_OVERSIZE = "[dropped by the reply cap: "


def reply_cap_notice(size: int, cap: int) -> str:
    """What replaces the rest of a reply cut at the cap (the model reads it next session)."""
    return f"\n[truncated: this reply was {size} bytes, over the {cap}-byte reply cap]"


def cap_completion(completion: Completion, cap: int) -> Completion:
    """``completion`` with its text cut at ``cap`` bytes (plus a notice) and every tool call
    whose arguments exceed ``cap`` emptied and marked (see the module doc)."""
    text = completion.text
    size = len(text.encode("utf-8"))
    if size > cap:
        kept = text.encode("utf-8")[:cap].decode("utf-8", errors="ignore")
        text = kept + reply_cap_notice(size, cap)
        _log.warning("turn.reply_capped", part="text", bytes=size, cap_bytes=cap)
    calls: list[ToolCall] = []
    for call in completion.tool_calls:
        raw = call.raw_arguments
        args_size = len(raw.encode("utf-8")) if raw is not None else _json_size(call.arguments)
        if args_size <= cap:
            calls.append(call)
            continue
        _log.warning(
            "turn.reply_capped", part="tool_call", tool=call.name, bytes=args_size, cap_bytes=cap
        )
        calls.append(
            ToolCall(id=call.id, name=call.name, raw_arguments=f"{_OVERSIZE}{args_size} bytes]")
        )
    if text is completion.text and calls == list(completion.tool_calls):
        return completion
    return replace(completion, text=text, tool_calls=tuple(calls))


def oversize_result(call: ToolCall, cap: int) -> ToolResult | None:
    """The error result for a call :func:`cap_completion` emptied; None for any other call."""
    if call.raw_arguments is None or not call.raw_arguments.startswith(_OVERSIZE):
        return None
    size = call.raw_arguments.removeprefix(_OVERSIZE).removesuffix("]")
    return ToolResult(
        f"error: the arguments for tool {call.name!r} were {size}, over the {cap}-byte reply "
        "cap; nothing was run. Call it again with smaller arguments",
        True,
        "bad_arguments",
    )


def _json_size(arguments: object) -> int:
    try:
        return len(json.dumps(arguments, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError):
        return 0

"""The Anthropic Messages API client (``POST {ANTHROPIC_BASE_URL}/v1/messages``).

httpx directly rather than the official ``anthropic`` SDK, on purpose:

- one retry/backoff policy shared with the OpenAI client (:mod:`.http`), instead of the SDK's
  own retry loop running inside ours (429 and 529 "overloaded" are retried by our loop alone);
- failures mapped onto our :class:`~workers.persona.errors.ModelError` hierarchy, keys scrubbed;
- a small dependency footprint on every worker (the SDK brings pydantic and more, for one
  endpoint);
- testable against a real local HTTP server that speaks the wire protocol.

Wire mapping: the system prompt is the top-level ``system`` string; assistant tool calls are
``tool_use`` content blocks; tool results are ``tool_result`` blocks in a user message. The API
requires user and assistant turns to alternate, so consecutive same-role messages (typically
several tool results, or tool results followed by new user input) are merged into one message,
tool results first, as the API also requires. Without ``ANTHROPIC_API_KEY`` no request is sent.

Prompt caching: the system prompt and the last content block of the conversation carry
``cache_control`` breakpoints (two of the four the API allows). A session sends the same soul
and the same history prefix on every call (see :mod:`workers.persona.session`), so each call
reads the cache up to the previous call's breakpoint and writes one more. The usage the API
reports for that (``cache_read_input_tokens``, ``cache_creation_input_tokens``) is parsed into
:class:`~workers.persona.messages.Usage`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from workers.persona.errors import ModelAuthError
from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.models.client import Endpoint, HTTPModel, MalformedAnswer, token_count
from workers.persona.models.config import ModelConfig

__all__ = ["ANTHROPIC_VERSION", "AnthropicModel"]

ANTHROPIC_VERSION = "2023-06-01"
_EPHEMERAL = {"type": "ephemeral"}


class AnthropicModel(HTTPModel):
    """One Claude model; safe to share between threads."""

    provider: ClassVar[str] = "anthropic"
    requires_key: ClassVar[bool] = True

    @staticmethod
    def _endpoint(config: ModelConfig) -> Endpoint:
        key = config.anthropic_api_key.reveal()
        auth = {"anthropic-version": ANTHROPIC_VERSION}
        if key:
            auth["x-api-key"] = key
        return Endpoint(
            config.anthropic_base_url, "ANTHROPIC_BASE_URL", key, "ANTHROPIC_API_KEY", auth
        )

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        if not self._has_key:
            # Raised here, not at construction, so a misconfigured persona becomes an "error"
            # turn result like any other model failure.
            raise ModelAuthError(
                "anthropic: no API key configured; set ANTHROPIC_API_KEY "
                "(the Messages API refuses unauthenticated requests)"
            )
        body: dict[str, Any] = {"model": self._model, "max_tokens": self._max_tokens}
        if system:
            body["system"] = [{"type": "text", "text": system, "cache_control": _EPHEMERAL}]
        if tools:
            body["tools"] = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": dict(tool.input_schema),
                }
                for tool in tools
            ]
        # Last, like the cache's own order (tools, system, messages): what came before is a
        # byte-stable prefix of the next request.
        body["messages"] = _wire_messages(messages)
        return self._post("/v1/messages", body, _parse)


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    """The wire role and content blocks of one message (empty text blocks are refused)."""
    if message.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or ""}
        if message.content:
            block["content"] = message.content
        block["is_error"] = message.is_error
        return "user", [block]
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    if message.role == "assistant":
        blocks.extend(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
            for call in message.tool_calls
        )
    return message.role, blocks


def _wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            merged: list[dict[str, Any]] = wire[-1]["content"] + blocks
            # Stable sort: tool results lead, everything else keeps its order.
            merged.sort(key=lambda b: b["type"] != "tool_result")
            wire[-1]["content"] = merged
        else:
            wire.append({"role": role, "content": blocks})
    if wire:
        # The end of the conversation so far: the next call extends exactly this prefix.
        last = wire[-1]["content"]
        last[-1] = {**last[-1], "cache_control": _EPHEMERAL}
    return wire


def _parse(data: Mapping[str, Any]) -> Completion:
    content = data.get("content")
    if not isinstance(content, list):
        if data.get("type") == "error" or "error" in data:
            raise MalformedAnswer("answer carries an error", answer=json.dumps(data))
        raise MalformedAnswer("answer has no content list")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise MalformedAnswer(f"content[{index}] is not an object")
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise MalformedAnswer(f"content[{index}] text block has no text")
            if text:
                texts.append(text)
        elif kind == "tool_use":
            calls.append(_call(block, index))
        # Other block types (thinking, server tools) carry nothing the loop acts on.
    stop = data.get("stop_reason")
    return Completion(
        text="\n\n".join(texts),
        tool_calls=tuple(calls),
        usage=_usage(data.get("usage")),
        stop_reason=stop if isinstance(stop, str) else None,
    )


def _call(block: Mapping[str, Any], index: int) -> ToolCall:
    call_id = block.get("id")
    name = block.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise MalformedAnswer(f"content[{index}] tool_use block has no id")
    if not isinstance(name, str) or not name:
        raise MalformedAnswer(f"content[{index}] tool_use block has no name")
    arguments = block.get("input")
    if isinstance(arguments, dict):
        return ToolCall(id=call_id, name=name, arguments=arguments)
    # Not an object: the loop answers this call with an error result the model can fix.
    return ToolCall(id=call_id, name=name, arguments={}, raw_arguments=json.dumps(arguments))


def _usage(raw: object) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    # Cached prompt tokens are reported apart from input_tokens; a budget counts them all.
    read = token_count(raw.get("cache_read_input_tokens"))
    written = token_count(raw.get("cache_creation_input_tokens"))
    return Usage(
        input_tokens=token_count(raw.get("input_tokens")) + read + written,
        output_tokens=token_count(raw.get("output_tokens")),
        cached_input_tokens=read,
        cache_write_input_tokens=written,
    )

"""The conversation vocabulary every part of a turn speaks: messages, tool calls, usage.

Provider clients translate to and from these; transcripts store them as JSON (``to_dict`` /
``from_dict``); the loop and the scripted model read them. Frozen, so a message handed to a
model or a transcript can never change under another reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

__all__ = ["Completion", "Message", "Role", "ToolCall", "ToolSpec", "Usage"]

Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model asked for.

    ``raw_arguments`` is set (and ``arguments`` empty) when the model sent arguments that are not
    a JSON object: the loop answers that call with an error result instead of running it.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    raw_arguments: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": dict(self.arguments)}
        if self.raw_arguments is not None:
            data["raw_arguments"] = self.raw_arguments
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        raw = data.get("raw_arguments")
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            arguments=dict(cast(Mapping[str, Any], data.get("arguments") or {})),
            raw_arguments=None if raw is None else str(raw),
        )


@dataclass(frozen=True, slots=True)
class Message:
    """A user, assistant or tool message.

    - user: ``content`` is the input.
    - assistant: ``content`` is its text (may be empty) and ``tool_calls`` what it asked to run.
    - tool: ``content`` is a tool's output for ``tool_call_id``; ``is_error`` marks a failure.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        if self.is_error:
            data["is_error"] = True
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        role = data["role"]
        if role not in ("user", "assistant", "tool"):
            raise ValueError(f"unknown message role {role!r}")
        calls = data.get("tool_calls") or ()
        call_id = data.get("tool_call_id")
        name = data.get("name")
        return cls(
            role=role,
            content=str(data.get("content") or ""),
            tool_calls=tuple(ToolCall.from_dict(c) for c in calls),
            tool_call_id=None if call_id is None else str(call_id),
            name=None if name is None else str(name),
            is_error=bool(data.get("is_error", False)),
        )


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage, summed over a turn with ``+``.

    ``input_tokens`` counts every prompt token, cached or not (a budget counts them all).
    ``cached_input_tokens`` is the part a provider served from its prompt cache (OpenAI
    ``prompt_tokens_details.cached_tokens``, Anthropic ``cache_read_input_tokens``);
    ``cache_write_input_tokens`` the part written to the cache on this call (Anthropic
    ``cache_creation_input_tokens``; OpenAI reports no such figure).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.cache_write_input_tokens + other.cache_write_input_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_input_tokens": self.cache_write_input_tokens,
        }


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a model is told about a tool: name, description, JSON Schema of its input."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Completion:
    """One model answer: text and/or tool calls, with the tokens it cost."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None

    def as_message(self) -> Message:
        return Message(role="assistant", content=self.text, tool_calls=self.tool_calls)

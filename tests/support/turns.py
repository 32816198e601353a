"""Test doubles for the turn engine (loop, run, driver): fake models and recording tools.

Only models are faked (a paid model is the one thing the house style lets tests mock); tools
here are real Tool implementations that record what they were asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.persona.clock import VirtualClock
from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.models import Model
from workers.persona.tools import ToolResult

__all__ = [
    "ALL_SEVEN",
    "Call",
    "PacedModel",
    "RecordingTool",
    "ReplayModel",
    "Watched",
    "call",
    "make_persona",
    "says",
]


@dataclass
class Call:
    """What a fake model was given on one complete() call."""

    system: str
    messages: tuple[Message, ...]
    tools: tuple[str, ...]


def says(text: str, *, tokens: int = 0) -> Completion:
    """A completion with only text."""
    return Completion(text=text, usage=Usage(tokens, 0))


def call(
    *calls: tuple[str, Mapping[str, Any]] | ToolCall, text: str = "", tokens: int = 0
) -> Completion:
    """A completion asking for tool calls, given as (name, args) pairs or ToolCall objects."""
    made = []
    for i, item in enumerate(calls):
        made.append(item if isinstance(item, ToolCall) else ToolCall(f"c{i}", item[0], item[1]))
    return Completion(text=text, tool_calls=tuple(made), usage=Usage(tokens, 0))


class ReplayModel:
    """Answers with the given completions in order (the last one repeats); records each call.

    An element may also be an exception instance (raised) or a callable taking the Call.
    """

    spec = "replay:test"

    def __init__(self, *answers: Completion | Exception | Callable[[Call], Completion]) -> None:
        self.answers = list(answers)
        self.calls: list[Call] = []

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        seen = Call(system, tuple(messages), tuple(t.name for t in tools))
        self.calls.append(seen)
        answer = self.answers[min(len(self.calls) - 1, len(self.answers) - 1)]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, Completion):
            return answer
        return answer(seen)


class PacedModel:
    """Takes ``delays[i]`` seconds of virtual time on its i-th call (0 after the list; timers
    fire meanwhile), then replies ``reply``. Records each call's last message and system prompt.

    Delays must run out: a model slower than the beat on EVERY turn keeps a virtual clock's
    advance() busy forever (each turn leaves a tick for the next), as it would in real time.
    """

    spec = "paced:test"

    def __init__(
        self, clock: VirtualClock, delays: Sequence[float], reply: str = "HEARTBEAT_OK"
    ) -> None:
        self.clock = clock
        self.delays = list(delays)
        self.reply = reply
        self.prompts: list[str] = []
        self.systems: list[str] = []

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        self.prompts.append(messages[-1].content)
        self.systems.append(system)
        n = len(self.prompts) - 1
        self.clock.advance(self.delays[n] if n < len(self.delays) else 0.0)
        return Completion(text=self.reply)


class Watched:
    """Wraps a real model and records the system prompt of every call (behaviour unchanged)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.systems: list[str] = []

    @property
    def spec(self) -> str:
        return self.model.spec

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        self.systems.append(system)
        return self.model.complete(system=system, messages=messages, tools=tools)


@dataclass
class RecordingTool:
    """A real tool that records its arguments and answers via ``fn`` (default: echo)."""

    name: str = "echo"
    description: str = "Echo the arguments back."
    input_schema: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {"text": {"type": "string"}}}
    )
    fn: Callable[[Mapping[str, Any]], ToolResult] | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        self.seen.append(dict(arguments))
        if self.fn is not None:
            return self.fn(arguments)
        return ToolResult(f"{self.name}: {dict(arguments)}")


ALL_SEVEN: dict[str, str] = {
    "AGENTS.md": "Operating rules: be brief.",
    "SOUL.md": "I am Ava, calm and precise.",
    "IDENTITY.md": "Name: Ava. Role: assistant.",
    "USER.md": "- The user is Sam.",
    "TOOLS.md": "Use memory for durable facts.",
    "HEARTBEAT.md": "- check the calendar",
    "MEMORY.md": "- Sam likes tea.",
}


def make_persona(
    root: Path,
    name: str = "ava",
    files: Mapping[str, str] | None = None,
    *,
    manifest: str | None = None,
) -> Path:
    """Create a persona directory ``root/name`` with ``files`` (default: all seven bootstrap
    files) and an optional persona.toml."""
    home = root / name
    home.mkdir(parents=True)
    for file, body in (ALL_SEVEN if files is None else files).items():
        (home / file).write_text(body, encoding="utf-8")
    if manifest is not None:
        (home / "persona.toml").write_text(manifest, encoding="utf-8")
    return home

"""What a tool is: a name, a description, a JSON Schema, and a synchronous ``execute``.

A tool never raises for misuse: bad arguments come back as a :class:`ToolResult` with
``is_error=True`` and a message the model can act on. (If a tool does raise, the loop turns the
exception into such a result; the model sees it, the turn goes on.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from workers.persona.messages import ToolSpec
from workers.persona.turn_time import bounded_timeout, time_left

__all__ = [
    "FunctionTool",
    "Tool",
    "ToolResult",
    "bounded_timeout",
    "is_tool_factory",
    "spec_of",
    "time_left",
    "tool_factory",
    "tool_source",
]

_FACTORY_MARK = "__soulfleet_tool_factory__"

F = TypeVar("F", bound=Callable[[], Any])


def tool_factory(fn: F) -> F:
    """Mark ``fn`` (no arguments, returns a :class:`Tool`) as a factory a persona's
    ``[[tools.python]] ref`` may name. Only marked callables are ever called: a persona file
    must not be able to call any function the worker can import (``os:abort``, ``os:fork``)."""
    setattr(fn, _FACTORY_MARK, True)
    return fn


def is_tool_factory(value: object) -> bool:
    """Whether ``value`` was marked by :func:`tool_factory`."""
    return callable(value) and getattr(value, _FACTORY_MARK, False) is True


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returns: its output text, and whether it is an error.

    ``failure`` optionally names the kind of error in one word (``timeout``, ``too_large``,
    ``server_died`` …) for the ``tool.call`` log and metric; the model only reads ``output``.
    """

    output: str
    is_error: bool = False
    failure: str | None = None


@runtime_checkable
class Tool(Protocol):
    """Anything with these four members can be given to a persona."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> Mapping[str, Any]: ...

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult: ...


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """A tool made from a plain function of its arguments."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    fn: Callable[[Mapping[str, Any]], ToolResult]
    source: str = "python"

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        result: object = self.fn(arguments)
        if not isinstance(result, ToolResult):
            # The model would otherwise read an AttributeError from deep in the loop.
            raise TypeError(
                f"the function of tool {self.name!r} returned {type(result).__name__}, not a "
                "ToolResult: it must return ToolResult(text) (or ToolResult(text, is_error=True))"
            )
        return result


def spec_of(tool: Tool) -> ToolSpec:
    """The part of a tool a model sees."""
    return ToolSpec(name=tool.name, description=tool.description, input_schema=tool.input_schema)


def tool_source(tool: Tool) -> str:
    """Where a tool comes from, for metrics: ``builtin`` (memory, transcript_search), ``mcp``,
    or ``python`` (anything else, the default for a tool that does not say)."""
    source = getattr(tool, "source", None)
    return source if isinstance(source, str) and source else "python"

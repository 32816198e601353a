"""Python tools for ``[[tools.python]] ref = ...`` tests (``tests.support.python_tools:...``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from workers.persona.tools import FunctionTool, ToolResult, tool_factory

__all__ = [
    "CALLS",
    "DESCRIBED_BY_A_NUMBER",
    "NAMELESS",
    "NOT_A_TOOL",
    "RELEASE",
    "SCHEMA_A_STRING",
    "SCHEMA_INFINITE",
    "SCHEMA_NOT_JSON",
    "broken_factory",
    "make_shout",
    "shout",
    "slow",
    "stuck_factory",
    "unmarked_factory",
]

_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def _shout(arguments: Mapping[str, Any]) -> ToolResult:
    return ToolResult(str(arguments.get("text", "")).upper())


shout = FunctionTool("shout", "Say the text in capitals.", _SCHEMA, _shout)


@tool_factory
def make_shout() -> FunctionTool:
    """A factory: ``ref`` may name a callable returning a Tool."""
    return FunctionTool("shout_made", "Say the text in capitals.", _SCHEMA, _shout)


def _slow(arguments: Mapping[str, Any]) -> ToolResult:
    time.sleep(float(arguments.get("seconds", 5)))
    return ToolResult("done")


slow = FunctionTool("slow", "Sleep, then answer.", {"type": "object"}, _slow)

NOT_A_TOOL = 42

# Tools of the right shape with fields of the wrong type (a Tool is a structural check).
NAMELESS: Any = FunctionTool(None, "No name.", _SCHEMA, _shout)  # type: ignore[arg-type]
SCHEMA_A_STRING: Any = FunctionTool("badschema", "x", "not a dict", _shout)  # type: ignore[arg-type]
SCHEMA_NOT_JSON: Any = FunctionTool("badjson", "x", {"type": object}, _shout)
SCHEMA_INFINITE: Any = FunctionTool("inf", "x", {"maximum": float("inf")}, _shout)
DESCRIBED_BY_A_NUMBER: Any = FunctionTool("numbered", 7, _SCHEMA, _shout)  # type: ignore[arg-type]


@tool_factory
def broken_factory() -> FunctionTool:
    raise RuntimeError("no weather today")


#: What :func:`stuck_factory` waits for (a test sets it once it has seen the factory refused).
RELEASE = threading.Event()


@tool_factory
def stuck_factory() -> FunctionTool:
    """A factory that does not return until :data:`RELEASE` is set."""
    RELEASE.wait(60)
    return FunctionTool("stuck", "Never in time.", _SCHEMA, _shout)


#: How many times :func:`unmarked_factory` ran (a persona file must never make it run).
CALLS: list[str] = []


def unmarked_factory() -> FunctionTool:
    """A callable returning a Tool, NOT marked with @tool_factory."""
    CALLS.append("unmarked_factory")
    return FunctionTool("unmarked", "Never built.", _SCHEMA, _shout)

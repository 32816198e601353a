"""What an MCP call gives back, in plain values: importable without loading the MCP SDK.

The SDK costs seconds to import on a busy machine, and every ``soulfleet`` command and every
worker imports the code that *may* talk MCP; so the values that cross from the hub's loop
thread to a turn live here, and :mod:`workers.persona.mcp_connection` (which imports the SDK)
loads only when a process first starts a server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STDERR_SAID",
    "CallOutcome",
    "McpToolInfo",
    "McpUnavailable",
    "describe_error",
    "for_the_model",
]

#: How a start failure quotes the server's last stderr line: for the operator (logs,
#: ``soulfleet tools``), cut from what the model is told (:func:`for_the_model`).
STDERR_SAID = " (its stderr said last: "


class McpUnavailable(Exception):
    """The server could not be started or reached; the message says why."""


_QUOTED = re.compile(re.escape(STDERR_SAID) + r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\)""")


def for_the_model(reason: str) -> str:
    """``reason`` without what the server printed (the rest, such as when it starts again,
    stays): that may hold what no masking knows to hide, and the model (and its provider)
    need only know the server is unavailable."""
    return _QUOTED.sub("", reason)


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """A tool as the server lists it."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What a call produced. ``failure`` is a short word for metrics when ``is_error``."""

    output: str
    is_error: bool = False
    failure: str | None = None


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of ``exc``; each of a task group's exceptions so, joined (the SDK's
    anyio groups wrap what a server's start or call raised)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_error(inner) for inner in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

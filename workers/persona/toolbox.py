"""A persona's declared tools, built for one turn: MCP servers' tools and Python tools, bounded.

:func:`build_declared` turns persona.toml's ``[tools]`` (:mod:`workers.persona.tool_config`)
into :class:`~workers.persona.tools.Tool` values in file order, answering the questions the
parser could not: a ``use`` must name a server of the fleet file, a ``ref`` must import, and the
names the model sees must be valid for both OpenAI and Anthropic (``^[a-zA-Z0-9_-]{1,64}$``) and
unique. Each failure is a
:class:`PersonaConfigError` naming the dotted key and the file, like any invalid persona.toml.

A server that cannot be reached is NOT a configuration error (it may be back next turn, and one
bad server must not silence a persona): its tools are left out of this turn and it is listed in
:attr:`Toolbox.unavailable` with the reason, which the turn logs and ``soulfleet tools`` shows.
Nor is an allow-list naming tools the server does not list (a typo, or a server upgrade that
renamed one): the tools it does list are offered, and the missing names are listed there too.

Every declared tool is bounded the same way: arguments and results over the byte caps become
error results naming the cap (the tool never sees the arguments; the model never sees the
oversized result), and the per-tool timeout applies (MCP: the hub; Python: a thread).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from workers.persona.errors import PersonaConfigError
from workers.persona.loop import Budget, observe_tool_outcome
from workers.persona.mcp_calls import McpToolInfo, McpUnavailable
from workers.persona.mcp_hub import McpHub
from workers.persona.mcp_servers import FleetServer, unknown_use
from workers.persona.python_tools import PythonTool, resolve_ref
from workers.persona.tool_config import (
    DEFAULT_TIMEOUT,
    McpDecl,
    McpServer,
    PythonDecl,
    ToolsConfig,
)
from workers.persona.tools import Tool, ToolResult, bounded_timeout, tool_source

__all__ = [
    "MCP_DESCRIPTION_MAX_CHARS",
    "MCP_SCHEMA_MAX_BYTES",
    "BoundedTool",
    "McpTool",
    "ToolLimits",
    "Toolbox",
    "build_declared",
    "build_within",
    "python_tool",
    "refuse_shared_names",
    "valid_tool_name",
]

_log = structlog.get_logger("soulfleet.tools")

#: The most of a server's tool description the model is shown (characters; cut with a note).
MCP_DESCRIPTION_MAX_CHARS = 8 * 1024
#: The largest input schema a server's tool may bring (bytes of JSON); a larger tool is left out.
MCP_SCHEMA_MAX_BYTES = 64 * 1024
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def valid_tool_name(name: str) -> bool:
    """True when both OpenAI and Anthropic accept ``name`` as a tool name."""
    return _NAME.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Byte caps on one call's arguments (as JSON) and result text."""

    max_args_bytes: int = 64 * 1024
    max_result_bytes: int = 128 * 1024


@dataclass(frozen=True, slots=True)
class Toolbox:
    """The declared tools of one turn, and the servers left out (prefix, server, reason)."""

    tools: tuple[Tool, ...]
    unavailable: tuple[tuple[str, str, str], ...] = ()

    def warn_unavailable(self, persona: str) -> None:
        """One ``tool.server_unavailable`` warning per server left out (or allow-listed tools it
        does not list), with its reason."""
        for prefix, server, reason in self.unavailable:
            _log.warning(
                "tool.server_unavailable",
                persona=persona,
                server=prefix,
                command=server,
                error=reason,
            )
            # Counted like a failed call, so a server that never starts shows in the metrics
            # (soulfleet_tool_calls_total{outcome="unavailable"}), not only in the logs.
            observe_tool_outcome("mcp", "unavailable")


class McpTool:
    """One tool of an MCP server, as the model sees it (``<prefix>__<tool>``)."""

    source = "mcp"

    def __init__(
        self,
        *,
        name: str,
        remote: str,
        description: str,
        input_schema: Mapping[str, Any],
        hub: McpHub,
        server: McpServer,
        timeout: float,
    ) -> None:
        self.name = name
        self.remote = remote
        self.description = description
        self.input_schema = input_schema
        self.server = server
        self.timeout = timeout
        self._hub = hub

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        timeout = bounded_timeout(self.timeout)  # never past the running turn's max_seconds
        outcome = self._hub.call(self.server, self.remote, arguments, timeout=timeout)
        return ToolResult(outcome.output, outcome.is_error, outcome.failure)


class BoundedTool:
    """Applies the byte caps around any tool."""

    def __init__(self, inner: Tool, limits: ToolLimits) -> None:
        self.inner = inner
        self.limits = limits
        self.name = inner.name
        self.description = inner.description
        self.input_schema = inner.input_schema
        self.source = tool_source(inner)

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        size = len(json.dumps(arguments, ensure_ascii=False).encode("utf-8"))
        if size > self.limits.max_args_bytes:
            return ToolResult(
                f"error: the arguments are {size:,} bytes, over the {self.limits.max_args_bytes:,}"
                " byte cap on tool arguments (SOULFLEET_TOOL_ARGS_MAX_BYTES); the tool was not "
                "run. Send less, or split the work over several calls.",
                True,
                "too_large",
            )
        result = self.inner.execute(arguments)
        size = len(result.output.encode("utf-8"))
        if size > self.limits.max_result_bytes:
            return ToolResult(
                f"error: the result of {self.name!r} was {size:,} bytes, over the "
                f"{self.limits.max_result_bytes:,} byte cap on tool results "
                "(SOULFLEET_TOOL_RESULT_MAX_BYTES), and was discarded. Ask for less (a smaller "
                "range, a filter, a page).",
                True,
                "too_large",
            )
        return result


def _server_of(
    decl: McpDecl, fleet: Mapping[str, FleetServer], source: object
) -> tuple[McpServer, float] | None:
    if decl.server is not None:
        return decl.server, decl.timeout or DEFAULT_TIMEOUT
    entry = fleet.get(str(decl.use))
    if entry is None:
        raise unknown_use(decl, fleet, source)
    if not entry.enabled:
        return None
    return entry.server, decl.timeout or entry.timeout or DEFAULT_TIMEOUT


def _not_listed(decl: McpDecl, listed: tuple[McpToolInfo, ...]) -> str | None:
    """Why some of ``decl``'s allow-list is missing from the server's listing, or None.

    Not a configuration error: a typo here, or a server upgrade that renamed a tool, would
    otherwise dead-letter every persona allowing it. The tools the server does list stay; the
    missing ones are reported as unavailable each turn (log, metric, ``soulfleet tools``)."""
    if decl.allow is None:
        return None
    have = {info.name for info in listed}
    missing = [name for name in decl.allow if name not in have]
    if not missing:
        return None
    return (
        f"{decl.key}.allow names tools the server does not list: {missing}; it lists: "
        f"{sorted(have)} (the allowed tools it lists are offered)"
    )


def _mcp_tools(
    decl: McpDecl,
    server: McpServer,
    timeout: float,
    hub: McpHub,
    *,
    listed: tuple[McpToolInfo, ...],
    source: object,
) -> list[tuple[str, Tool]]:
    if decl.allow is not None:
        listed = tuple(info for info in listed if info.name in decl.allow)
    tools: list[tuple[str, Tool]] = []
    for info in listed:
        name = f"{decl.name}__{_UNSAFE.sub('_', info.name)}"
        if not valid_tool_name(name):
            raise PersonaConfigError(
                source,
                f"{decl.key}.name",
                f"gives the server's tool {info.name!r} the name {name!r}, longer than the 64 "
                "characters models accept: choose a shorter name or an allow-list without it",
            )
        schema_bytes = len(json.dumps(info.input_schema, ensure_ascii=False).encode("utf-8"))
        if schema_bytes > MCP_SCHEMA_MAX_BYTES:
            # Sent with every model call of the turn: a server's listing must not be able to
            # make each call that much dearer. The tool is left out; the others stay.
            _log.warning("mcp.tool_refused", server=server.describe(), tool=info.name,
                         reason=f"input schema of {schema_bytes} bytes, over "
                                f"{MCP_SCHEMA_MAX_BYTES}")  # fmt: skip
            continue
        description = info.description
        if len(description) > MCP_DESCRIPTION_MAX_CHARS:
            description = (
                f"{description[:MCP_DESCRIPTION_MAX_CHARS]} [description cut at "
                f"{MCP_DESCRIPTION_MAX_CHARS} characters]"
            )
        tool = McpTool(
            name=name,
            remote=info.name,
            description=description,
            input_schema=info.input_schema,
            hub=hub,
            server=server,
            timeout=timeout,
        )
        tools.append((f"{decl.key} (server tool {info.name!r})", tool))
    return tools


def build_declared(
    config: ToolsConfig,
    *,
    hub: McpHub,
    fleet: Mapping[str, FleetServer] | None = None,
    limits: ToolLimits | None = None,
    reserved: tuple[str, ...] = ("memory",),
    wait: float | None = None,
) -> Toolbox:
    """The declared tools in file order (starting MCP servers as needed, side by side, waiting
    ``wait`` seconds at most for them: default the hub's ``start_timeout``; a server not up by
    then is left out of this turn, and its start goes on for the next).

    ``reserved`` are names the runtime adds itself (``memory``): a declared tool may not take
    them. Raises PersonaConfigError for configuration the fleet, the environment or a server
    contradicts.
    """
    source = config.source
    bounds = limits or ToolLimits()
    servers = {
        decl.key: found
        for decl in config.entries
        if isinstance(decl, McpDecl) and (found := _server_of(decl, fleet or {}, source))
    }
    distinct = list(dict.fromkeys(server for server, _ in servers.values()))
    listings = dict(zip(distinct, hub.tools_of(distinct, wait) if distinct else [], strict=True))
    named: list[tuple[str, Tool]] = []
    unavailable: list[tuple[str, str, str]] = []
    for decl in config.entries:
        if isinstance(decl, McpDecl):
            if decl.key not in servers:
                continue
            server, timeout = servers[decl.key]
            listed = listings[server]
            if isinstance(listed, McpUnavailable):
                unavailable.append((decl.name, server.describe(), str(listed)))
                continue
            missing = _not_listed(decl, listed)
            if missing is not None:
                unavailable.append((decl.name, server.describe(), missing))
            named.extend(_mcp_tools(decl, server, timeout, hub, listed=listed, source=source))
            continue
        tool = python_tool(decl, source)
        named.append((decl.key, PythonTool(tool, timeout=decl.timeout or DEFAULT_TIMEOUT)))
    refuse_shared_names([(where, tool.name) for where, tool in named], reserved, source)
    return Toolbox(tuple(BoundedTool(tool, bounds) for _, tool in named), tuple(unavailable))


def python_tool(decl: PythonDecl, source: object) -> Tool:
    """The Tool a ``[[tools.python]]`` entry names, imported, its name checked."""
    tool = resolve_ref(decl, source)
    problem = _shape_problem(tool)
    if problem is not None:
        raise PersonaConfigError(source, f"{decl.key}.ref", f"gives {problem}")
    if not valid_tool_name(tool.name):
        raise PersonaConfigError(
            source,
            f"{decl.key}.ref",
            f"gives a tool named {tool.name!r}; tool names must match ^[a-zA-Z0-9_-]{{1,64}}$",
        )
    return tool


def _shape_problem(tool: Tool) -> str | None:
    """What is wrong with a Tool's fields, or None. ``Tool`` is a structural check (it has the
    attributes): a name that is not a string, or a schema that is not a JSON object, failed
    later, in the provider request, naming nothing."""
    name: object = tool.name
    description: object = tool.description
    if not isinstance(name, str):
        return f"a tool whose name is {type(name).__name__}, not a string"
    if not isinstance(description, str):
        return f"tool {name!r} a description that is {type(description).__name__}, not a string"
    schema: object = tool.input_schema
    if not isinstance(schema, Mapping):
        return (
            f"tool {name!r} an input_schema that is {type(schema).__name__}, not a JSON "
            "object (a dict)"
        )
    try:
        json.dumps(dict(schema), allow_nan=False)  # as the request is encoded
    except (TypeError, ValueError) as exc:
        return f"tool {name!r} an input_schema that is not JSON: {exc}"
    return None


def refuse_shared_names(
    named: Sequence[tuple[str, str]], reserved: Sequence[str], source: object
) -> None:
    """Raise PersonaConfigError naming both entries when two ``(where, tool name)`` share a
    name, or one takes a ``reserved`` name (``memory``)."""
    seen: dict[str, str] = dict.fromkeys(reserved, "the built-in tool")
    for where, name in named:
        if name in seen:
            raise PersonaConfigError(
                source,
                where.split(" ", 1)[0],
                f"gives a tool named {name!r}, and so does {seen[name]}: a model calls "
                "tools by name, so one of them would be unreachable",
            )
        seen[name] = where


def build_within(
    config: ToolsConfig,
    budget: Budget,
    *,
    hub: McpHub,
    fleet: Mapping[str, FleetServer] | None = None,
    limits: ToolLimits | None = None,
    reserved: tuple[str, ...] = ("memory",),
) -> tuple[Toolbox, Budget]:
    """:func:`build_declared` waiting for MCP servers no longer than ``budget.max_seconds``,
    and ``budget`` less the time that took: a turn's ``max_seconds`` covers its servers'
    starts too, so a server that hangs at start cannot stretch the turn."""
    began = time.monotonic()
    box = build_declared(
        config, hub=hub, fleet=fleet, limits=limits, reserved=reserved, wait=budget.max_seconds
    )
    left = max(0.0, budget.max_seconds - (time.monotonic() - began))
    return box, replace(budget, max_seconds=left)

"""The ``[tools]`` part of persona.toml: which MCP servers and Python tools a persona declares.

::

    [[tools.mcp]]
    name = "time"                      # prefix of the names the model sees: time__get_current_time
    command = "mcp-server-time"        # a stdio server: command + args (+ env) ...
    args = ["--local-timezone", "UTC"]
    env = { TZ = "UTC" }
    # url = "http://127.0.0.1:8000/mcp"  ... or a streamable HTTP server (+ headers)
    allow = ["get_current_time"]       # optional allow-list of the server's tools
    timeout = "30s"                    # per call

    [[tools.mcp]]
    use = "github"                     # a server of the fleet-wide SOULFLEET_MCP_CONFIG file

    [[tools.python]]
    ref = "mypkg.tools:weather_tool"   # a Tool, or a @tool_factory function returning one

Only the SHAPE is checked here (keys, types, names): whether a ``use`` names a fleet server
and whether a ``ref`` imports can only be answered by the fleet configuration or the Python
environment, so :mod:`workers.persona.toolbox` answers them when a turn builds its tools, with
the same :class:`PersonaConfigError` naming the dotted key and the file (an allow-list naming
a tool the server does not list only leaves that tool out).

The order of the declarations in the file is the order of the tools in a turn. ``tomllib``
keeps each array's order but not how ``[[tools.mcp]]`` and ``[[tools.python]]`` interleave,
so the interleaving is read from the table headers in the text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from workers.persona.errors import PersonaConfigError
from workers.persona.toml_table import TomlTable

__all__ = [
    "DEFAULT_TIMEOUT",
    "McpDecl",
    "McpServer",
    "PythonDecl",
    "ToolDecl",
    "ToolsConfig",
    "parse_tools",
    "server_from_table",
    "valid_prefix",
]

DEFAULT_TIMEOUT = 30.0
# The model sees "<name>__<tool>": both OpenAI and Anthropic accept ^[a-zA-Z0-9_-]{1,64}$, and a
# prefix short enough leaves the tool part room. "__" inside a prefix would make names ambiguous.
_PREFIX = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9-]*(?:_[a-zA-Z0-9-]+)*")
_PREFIX_MAX = 32
_REF = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_HEADER = re.compile(r"^\s*\[\[\s*tools\s*\.\s*(mcp|python)\s*\]\]", re.MULTILINE)


def valid_prefix(name: str) -> bool:
    """True for a server name usable as a tool-name prefix (letters, digits, - and single _)."""
    return len(name) <= _PREFIX_MAX and _PREFIX.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class McpServer:
    """How to reach one MCP server. Hashable: equal values share one session per process.

    ``env`` and ``headers`` may hold tokens, so they stay out of its repr (a Settings object or
    a traceback may print it).
    """

    transport: Literal["stdio", "http"]
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def describe(self) -> str:
        """A one-line description for logs and errors: never env values or headers (secrets)."""
        if self.transport == "http":
            return str(self.url)
        return " ".join([str(self.command), *self.args])


@dataclass(frozen=True, slots=True)
class McpDecl:
    """One ``[[tools.mcp]]`` entry. ``server`` is None for a ``use`` of a fleet server."""

    key: str
    name: str
    server: McpServer | None
    use: str | None
    allow: tuple[str, ...] | None
    timeout: float | None


@dataclass(frozen=True, slots=True)
class PythonDecl:
    """One ``[[tools.python]]`` entry."""

    key: str
    ref: str
    timeout: float | None


ToolDecl = McpDecl | PythonDecl


@dataclass(frozen=True, slots=True)
class ToolsConfig:
    """The declared tools in file order; ``source`` names persona.toml in later errors."""

    entries: tuple[ToolDecl, ...] = ()
    source: object = field(default=None, compare=False)


def _fail(source: object, key: str, problem: str) -> PersonaConfigError:
    return PersonaConfigError(source, key, problem)


def server_from_table(table: Mapping[str, Any], key: str, src: object) -> McpServer:
    """``command`` (+ ``args``, ``env``) or ``url`` (+ ``headers``) -> :class:`McpServer`."""
    return _server(TomlTable(table, key, src))


def _server(table: TomlTable) -> McpServer:
    command = table.string("command", blank=False)
    url = table.string("url", blank=False)
    if command is not None and url is not None:
        raise table.fail("url", "cannot be combined with command: a server is one or other")
    if url is not None:
        if not url.startswith(("http://", "https://")):
            raise table.fail("url", f"must be an http:// or https:// URL, got {url!r}")
        for name in ("args", "env"):
            if name in table.data:
                raise table.fail(name, "only applies to a stdio server (command)")
        return McpServer("http", url=url, headers=table.pairs("headers", env=False))
    if command is None:
        raise table.fail(
            "command",
            'is missing: a server needs command = "..." (stdio) or url = "http://..." (HTTP)',
        )
    if "headers" in table.data:
        raise table.fail("headers", "only applies to an HTTP server (url)")
    return McpServer(
        "stdio",
        command=command,
        args=table.strings("args") or (),
        env=table.pairs("env", env=True),
    )


def _mcp(value: object, key: str, src: object) -> McpDecl:
    table = TomlTable.of(value, key, src)
    use = table.string("use", blank=False)
    if use is not None:
        table.check_keys(("use", "name", "allow", "timeout"))
    else:
        table.check_keys(("name", "command", "args", "env", "url", "headers", "allow", "timeout"))
    name = table.string("name", blank=False) or use
    if name is None:
        raise table.fail("name", 'is missing: the prefix of the tool names (name = "time")')
    if not valid_prefix(name):
        raise table.fail(
            "name",
            f"must be 1-{_PREFIX_MAX} letters, digits, '-' or single '_' (it prefixes tool names "
            f"as <name>__<tool>), got {name!r}",
        )
    allow = table.strings("allow")
    server = None if use is not None else _server(table)
    return McpDecl(key, name, server, use, allow, table.duration("timeout"))


def _python(value: object, key: str, src: object) -> PythonDecl:
    table = TomlTable.of(value, key, src)
    table.check_keys(("ref", "timeout"))
    ref = table.string("ref", blank=False)
    if ref is None:
        raise table.fail("ref", 'is missing: ref = "package.module:attribute"')
    if _REF.fullmatch(ref) is None:
        raise table.fail("ref", f'must look like "package.module:attribute", got {ref!r}')
    return PythonDecl(key, ref, table.duration("timeout"))


def _file_order(text: str, mcp: int, python: int) -> list[str] | None:
    """Which array each declaration came from, in file order (None: not all from headers)."""
    kinds = [match.group(1) for match in _HEADER.finditer(text)]
    if kinds.count("mcp") == mcp and kinds.count("python") == python:
        return kinds
    return None


def parse_tools(value: object, *, text: str = "", source: object = None) -> ToolsConfig:
    """Validate the ``tools`` table of persona.toml (``text`` is the file, for the order)."""
    if value is None:
        return ToolsConfig(source=source)
    TomlTable.of(value, "tools", source).check_keys(("mcp", "python"))
    assert isinstance(value, dict)  # TomlTable.of refused anything else
    groups: dict[str, list[ToolDecl]] = {}
    for kind in value:
        items = value[kind]
        if not isinstance(items, list):
            raise _fail(source, f"tools.{kind}", f"must be an array of tables ([[tools.{kind}]])")
        parse = _mcp if kind == "mcp" else _python
        groups[kind] = [parse(item, f"tools.{kind}[{n}]", source) for n, item in enumerate(items)]
    order = _file_order(text, len(groups.get("mcp", [])), len(groups.get("python", [])))
    if order is None:  # inline arrays: keep the order the two keys first appear in
        entries = [decl for kind in groups for decl in groups[kind]]
    else:
        queues = {kind: iter(decls) for kind, decls in groups.items()}
        entries = [next(queues[kind]) for kind in order]
    prefixes: dict[str, str] = {}
    for decl in entries:
        if isinstance(decl, McpDecl):
            if decl.name in prefixes:
                raise _fail(
                    source,
                    f"{decl.key}.name",
                    f"{decl.name!r} is already the name of {prefixes[decl.name]}: "
                    "two servers with one name would give their tools the same names",
                )
            prefixes[decl.name] = decl.key
    return ToolsConfig(tuple(entries), source)

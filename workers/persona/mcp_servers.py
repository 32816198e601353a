"""The fleet-wide MCP server file (``SOULFLEET_MCP_CONFIG``), in the common ``mcpServers`` shape.

Claude Desktop, Cursor, opencode and most MCP hosts share one JSON shape, so an operator can
reuse the file they already have::

    {"mcpServers": {
        "time":   {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
        "search": {"url": "https://mcp.example.com/mcp",
                   "headers": {"Authorization": "Bearer ${SEARCH_TOKEN}"}, "timeout": 20000}
    }}

A persona then uses a server by name (``[[tools.mcp]] use = "time"``). Accepted as the other
hosts accept it: the wrapper key may be ``mcpServers``, ``servers`` or ``mcp``; ``command`` may
be a string (with ``args``) or an argv list; ``environment`` is an alias of ``env``; ``type``
(``local``/``stdio`` or ``remote``/``http``/``streamable-http``) is optional and checked against
the keys; ``timeout`` is in milliseconds; ``"disabled": true`` or ``"enabled": false`` keeps a
server in the file but offers none of its tools. Anything else is an error naming the server
and the key: a fleet file is read once at start-up, and a typo must stop the process then.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.persona.errors import PersonaConfigError, SettingsError
from workers.persona.tool_config import (
    McpDecl,
    McpServer,
    ToolsConfig,
    server_from_table,
    valid_prefix,
)

__all__ = ["FleetServer", "check_uses", "load_mcp_servers", "parse_mcp_servers", "unknown_use"]

_VARIABLE = "SOULFLEET_MCP_CONFIG"
_KEYS = (
    "type",
    "command",
    "args",
    "env",
    "environment",
    "url",
    "headers",
    "timeout",
    "disabled",
    "enabled",
)
_TYPES = {"local": "stdio", "stdio": "stdio", "remote": "http", "http": "http"}
_TYPES["streamable-http"] = "http"
_TYPES["streamable_http"] = "http"


@dataclass(frozen=True, slots=True)
class FleetServer:
    """One server of the fleet file: how to reach it, its call timeout, and whether it is on."""

    server: McpServer
    timeout: float | None = None
    enabled: bool = True


def _fail(where: str, problem: str) -> SettingsError:
    return SettingsError(_VARIABLE, f"{where}: {problem}")


def _server(raw: object, where: str) -> FleetServer:
    if not isinstance(raw, dict):
        raise _fail(where, f"must be an object, got {raw!r}")
    for key in raw:
        if key not in _KEYS:
            raise _fail(f"{where}.{key}", f"is not a known key (known: {', '.join(_KEYS)})")
    table: dict[str, Any] = dict(raw)
    kind = table.pop("type", None)
    if "environment" in table:
        table["env"] = table.pop("environment")
    command = table.get("command")
    if isinstance(command, list):
        if not command or not all(isinstance(part, str) for part in command):
            raise _fail(f"{where}.command", "must be a non-empty list of strings")
        if "args" in table:
            raise _fail(f"{where}.args", "cannot be combined with an argv list in command")
        table["command"], table["args"] = command[0], command[1:]
    timeout_ms = table.pop("timeout", None)
    disabled = table.pop("disabled", False)
    enabled = table.pop("enabled", True)
    if not isinstance(disabled, bool) or not isinstance(enabled, bool):
        raise _fail(where, "disabled and enabled must be true or false")
    try:
        server = server_from_table(table, where, None)
    except PersonaConfigError as exc:
        raise _fail(str(exc.key), exc.problem) from None
    if kind is not None and _TYPES.get(str(kind)) != server.transport:
        raise _fail(
            f"{where}.type",
            f"is {kind!r}, but the server has {'a url' if server.url else 'a command'}",
        )
    timeout: float | None = None
    if timeout_ms is not None:
        if (
            isinstance(timeout_ms, bool)
            or not isinstance(timeout_ms, int | float)
            or timeout_ms <= 0
        ):
            raise _fail(f"{where}.timeout", f"must be a positive number of ms, got {timeout_ms!r}")
        timeout = float(timeout_ms) / 1000.0
    return FleetServer(server, timeout, enabled and not disabled)


def parse_mcp_servers(text: str, *, source: object = None) -> Mapping[str, FleetServer]:
    """Parse the file's text; a bad file is a :class:`SettingsError` naming the variable."""
    where = f"{source}" if source is not None else "file"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(where, f"is not valid JSON: {exc}") from None
    except RecursionError:
        raise _fail(where, "is nested too deeply to read") from None
    if not isinstance(data, dict):
        raise _fail(where, 'must be a JSON object such as {"mcpServers": {...}}')
    wrappers = [key for key in ("mcpServers", "servers", "mcp") if key in data]
    if len(wrappers) != 1:
        raise _fail(where, 'must have exactly one of the keys "mcpServers", "servers" or "mcp"')
    servers = data[wrappers[0]]
    if not isinstance(servers, dict):
        raise _fail(f"{where}: {wrappers[0]}", "must be an object of name -> server")
    result: dict[str, FleetServer] = {}
    for name, raw in servers.items():
        if not valid_prefix(name):
            raise _fail(
                f"{where}: {wrappers[0]}.{name}",
                "is not a usable server name (letters, digits, '-' and single '_'; at most 32)",
            )
        result[name] = _server(raw, f"{where}: {wrappers[0]}.{name}")
    return result


def load_mcp_servers(path: Path) -> Mapping[str, FleetServer]:
    """Read and parse the file at ``path`` (a missing or unreadable file names the variable)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail(str(path), f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise _fail(str(path), f"is not valid UTF-8 (byte {exc.start})") from None
    return parse_mcp_servers(text, source=path)


def unknown_use(
    decl: McpDecl, fleet: Mapping[str, FleetServer], source: object
) -> PersonaConfigError:
    """The error for a ``use`` naming no server of the fleet file."""
    known = ", ".join(sorted(fleet)) or "none: SOULFLEET_MCP_CONFIG is not set"
    return PersonaConfigError(
        source,
        f"{decl.key}.use",
        f"names no server of the fleet's MCP config (SOULFLEET_MCP_CONFIG); known: {known}",
    )


def check_uses(tools: ToolsConfig, fleet: Mapping[str, FleetServer]) -> None:
    """Every ``use`` of persona.toml names a server of the fleet file (PersonaConfigError)."""
    for decl in tools.entries:
        if isinstance(decl, McpDecl) and decl.use is not None and decl.use not in fleet:
            raise unknown_use(decl, fleet, tools.source)

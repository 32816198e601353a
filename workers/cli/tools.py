"""``soulfleet tools PERSONA [--json]``: the tools a persona's turn offers, as the model sees them.

Built exactly as a worker builds them (persona.toml's ``[tools]`` through
:func:`workers.persona.toolbox.build_declared`, then ``memory``), so MCP servers are started
and asked for their tools: the listing shows the real names (``time__get_current_time``),
descriptions and schemas, in the order the model gets them. A server that cannot be started or
reached is named with its error (stderr, or ``unavailable`` in ``--json``) and the exit status
is 1, as for an allow-list naming a tool the server does not list; an invalid tool
configuration (bad ref, unknown ``use``) is an invalid persona, exit 2. The servers are
stopped before the command exits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from workers.cli.context import persona_dir
from workers.cli.errors import EXIT_FAILURE
from workers.cli.group import cli_context, personas_option
from workers.persona.agent import from_dir
from workers.persona.mcp_hub import McpHub
from workers.persona.toolbox import McpTool, ToolLimits, build_declared
from workers.persona.tools import Tool, tool_source

__all__ = ["tools"]


def _describe(tool: Tool) -> dict[str, Any]:
    inner = getattr(tool, "inner", tool)
    entry: dict[str, Any] = {
        "name": tool.name,
        "source": tool_source(tool),
        "description": tool.description,
        "input_schema": dict(tool.input_schema),
    }
    if isinstance(inner, McpTool):
        entry["server"] = tool.name.split("__", 1)[0]
        entry["server_tool"] = inner.remote
        entry["command"] = inner.server.describe()
    return entry


@click.command()
@click.argument("persona")
@click.option("--json", "as_json", is_flag=True, help="Print the tools and unavailable servers.")
@personas_option
@click.pass_context
def tools(ctx: click.Context, persona: str, as_json: bool, personas: Path | None) -> None:
    """List PERSONA's tools as the model sees them (starting its MCP servers to ask them)."""
    context = cli_context(ctx, personas)
    settings = context.settings
    agent = from_dir(persona_dir(persona, settings.personas))
    # The servers the fleet's workers know (a running `up` records the file it was given).
    servers = context.fleet_mcp_servers()
    hub = McpHub()
    try:
        with context.refusals_explained():
            box = build_declared(
                agent.declared,
                hub=hub,
                fleet=settings.mcp_servers if servers is None else servers,
                limits=ToolLimits(settings.tool_args_max_bytes, settings.tool_result_max_bytes),
                reserved=("memory",) if agent.memory else (),
            )
        offered = agent.toolset(
            lock_mode=settings.lock_mode, lock_timeout=settings.lock_timeout, declared=box.tools
        )
    finally:
        hub.close()
    listed = [_describe(tool) for tool in offered]
    unavailable = [
        {"server": prefix, "command": command, "error": error}
        for prefix, command, error in box.unavailable
    ]
    if as_json:
        click.echo(json.dumps({"tools": listed, "unavailable": unavailable}, ensure_ascii=False))
    else:
        if not listed and not unavailable:  # `memory = false`, nothing declared: say so
            click.echo(f"persona {agent.name} has no tools (memory = false, none declared)")
        for entry in listed:
            where = f"mcp {entry['command']}" if "command" in entry else entry["source"]
            summary = (entry["description"].strip().splitlines() or [""])[0][:100]
            click.echo(f"{entry['name']}  [{where}]  {summary}")
        for item in unavailable:
            click.echo(
                f"unavailable: server {item['server']!r} ({item['command']}): {item['error']}",
                err=True,
            )
    if unavailable:
        ctx.exit(EXIT_FAILURE)

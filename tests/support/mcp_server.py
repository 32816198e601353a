"""A misbehaving MCP server for tests, written with the official SDK (stdio or streamable HTTP).

Run as a script (it imports nothing from soulfleet, so a stdio child needs no PYTHONPATH)::

    python tests/support/mcp_server.py                 # stdio
    python tests/support/mcp_server.py --http 8765     # streamable HTTP on 127.0.0.1:8765/mcp

Tools: ``echo`` (text back), ``whoami`` (this process's pid and its call count, so tests can
tell one shared session from many), ``sleep`` (seconds), ``crash`` (the process exits in the
middle of the call), ``big`` (a result of N megabytes) and ``fail`` (the tool raises).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from mcp.server.mcpserver import MCPServer

SERVER_PATH = os.path.abspath(__file__)

server = MCPServer("soulfleet-test-server")
_calls = {"n": 0}


@server.tool(description="Return the text you send.")
def echo(text: str) -> str:
    _calls["n"] += 1
    return text


@server.tool(description="This server process's pid and how many calls it has served.")
def whoami() -> str:
    _calls["n"] += 1
    return f"pid={os.getpid()} calls={_calls['n']}"


@server.tool(description="Sleep for the given seconds, then answer.")
async def sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool(description="Exit the server process in the middle of the call.")
async def crash() -> str:
    await asyncio.sleep(0.05)
    os._exit(3)


@server.tool(description="Return a result of the given size in megabytes.")
def big(megabytes: float) -> str:
    return "x" * int(megabytes * 1024 * 1024)


@server.tool(description="Raise an error with the given message.")
def fail(message: str) -> str:
    raise ValueError(message)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=0, help="serve streamable HTTP on this port")
    # Ignored by the server: a marker in its command line so tests can count its processes.
    parser.add_argument("--tag", default="")
    parser.add_argument("--start-delay", type=float, default=0.0, help="seconds before serving")
    args = parser.parse_args()
    time.sleep(args.start_delay)  # a slow server: its start takes this long, every time
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()

"""A hostile stdio MCP server for the hub's restart tests: `wedge` blocks its event loop (pings
go unanswered, stdin EOF unseen) and SIGTERM is ignored, so tearing it down takes the hub's
whole grace period and a KILL. ``--tag`` marks the process for tests/support/mcp_helpers.py."""

from __future__ import annotations

import argparse
import os
import signal
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("hostile")


@server.tool(description="pid")
def whoami() -> str:
    return f"pid={os.getpid()}"


@server.tool(description="block the whole server")
async def wedge(seconds: float) -> str:
    time.sleep(seconds)  # blocks the loop: pings go unanswered, stdin EOF is not seen
    return "done"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", default="")
    parser.parse_args()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server.run()


if __name__ == "__main__":
    main()

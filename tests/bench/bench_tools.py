"""Benchmark an MCP tool call through the fleet's client vs the SDK directly, and PRINT it.

Run:  .venv/bin/python -m tests.bench.bench_tools [--calls 1000] [--server time|test]

Both sides call the same stdio server process kind with the same tool and arguments:

- ``sdk``: one :class:`mcp.ClientSession` in one asyncio program, awaiting ``call_tool`` in a
  loop (the floor: the SDK and the server, nothing else);
- ``fleet``: the tool a turn gets (:func:`workers.persona.toolbox.build_declared`: byte caps,
  the hub's loop thread, ``run_coroutine_threadsafe`` from the calling thread, the per-call
  timeout), called from a plain thread as a worker's pool thread calls it.

The two sides alternate in ``--rounds`` rounds (a fresh server each), so a change in the
machine's load lands on both rather than on whichever ran second.

Printed: median and p99 per call for each, the fleet's overhead (the difference), and the
bare cost of the thread hop the fleet adds (a no-op coroutine to a loop thread and back): on a
machine with idle cores the overhead is about that hop; on a saturated one each hop waits for
the scheduler and the difference moves by milliseconds from run to run. The
server defaults to ``mcp-server-time`` (``get_current_time``); ``--server test`` uses the
SDK-written test server's ``echo``. Figures depend on the machine and its load; they are for
comparing changes on one machine, not targets.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcp import ClientSession, stdio_client

from tests.support.mcp_helpers import SERVER_SCRIPT
from workers.persona.mcp_hub import McpHub
from workers.persona.mcp_transport import stdio_parameters
from workers.persona.tool_config import McpDecl, McpServer, ToolsConfig
from workers.persona.toolbox import build_declared

__all__ = ["main"]


def _target(kind: str) -> tuple[McpServer, str, dict[str, Any]]:
    if kind == "test":
        server = McpServer("stdio", command=sys.executable, args=(str(SERVER_SCRIPT),))
        return server, "echo", {"text": "hello"}
    server = McpServer("stdio", command="mcp-server-time", args=("--local-timezone", "UTC"))
    return server, "get_current_time", {"timezone": "UTC"}


def _figures(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p99 * 1000


async def _sdk(server: McpServer, tool: str, args: dict[str, Any], calls: int) -> list[float]:
    samples: list[float] = []
    async with (
        stdio_client(stdio_parameters(server)) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for _ in range(20):
            await session.call_tool(tool, args)
        for _ in range(calls):
            started = time.perf_counter()
            await session.call_tool(tool, args)
            samples.append(time.perf_counter() - started)
    return samples


def _fleet(server: McpServer, tool: str, args: dict[str, Any], calls: int) -> list[float]:
    hub = McpHub(start_timeout=120)
    try:
        decl = McpDecl("tools.mcp[0]", "bench", server, None, (tool,), 30.0)
        [declared] = build_declared(ToolsConfig((decl,)), hub=hub).tools
        for _ in range(20):
            declared.execute(args)
        samples: list[float] = []
        for _ in range(calls):
            started = time.perf_counter()
            result = declared.execute(args)
            samples.append(time.perf_counter() - started)
            if result.is_error:
                raise SystemExit(f"bench: the call failed: {result.output}")
        return samples
    finally:
        hub.close()


def _hop(calls: int) -> list[float]:
    """The floor of the fleet's design: one no-op coroutine to a loop thread and back."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def noop() -> None:
        return None

    samples: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        asyncio.run_coroutine_threadsafe(noop(), loop).result(30)
        samples.append(time.perf_counter() - started)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server", choices=("time", "test"), default="time")
    options = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    server, tool, args = _target(options.server)
    per_round = max(1, options.calls // options.rounds)
    sdk: list[float] = []
    fleet: list[float] = []
    for _ in range(options.rounds):
        sdk += asyncio.run(_sdk(server, tool, args, per_round))
        fleet += _fleet(server, tool, args, per_round)
    hop_median, hop_p99 = _figures(_hop(options.calls))
    sdk_median, sdk_p99 = _figures(sdk)
    fleet_median, fleet_p99 = _figures(fleet)
    print(f"MCP tool call, {len(sdk)} calls each of {tool} on {server.describe()}:")
    print(f"  sdk directly : median {sdk_median:7.3f} ms   p99 {sdk_p99:7.3f} ms")
    print(f"  fleet client : median {fleet_median:7.3f} ms   p99 {fleet_p99:7.3f} ms")
    print(
        f"  overhead     : median {fleet_median - sdk_median:+7.3f} ms   "
        f"p99 {fleet_p99 - sdk_p99:+7.3f} ms"
    )
    print(
        f"  thread hop   : median {hop_median:7.3f} ms   p99 {hop_p99:7.3f} ms (no-op, for scale)"
    )


if __name__ == "__main__":
    main()

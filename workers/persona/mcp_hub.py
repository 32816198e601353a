"""A process's MCP sessions: one event-loop thread owns them all; any thread may call.

The SDK is asyncio and a session is bound to the loop it was opened on, while turns run on a
worker's thread pool. So the hub starts ONE daemon thread running ONE event loop (on first use,
never at import or before a prefork fork) and keeps one :class:`McpConnection` per distinct
:class:`~workers.persona.tool_config.McpServer`: fifty turns of personas declaring the same
server share one session and one server process. A pool thread submits a coroutine with
``run_coroutine_threadsafe`` and waits on its future, bounded, so a wedged loop can delay a
call by its own timeout at most, never hang a turn.

:meth:`McpHub.close` (worker shutdown, the end of a CLI command) closes every session: stdio
servers get their stdin closed, then SIGTERM and SIGKILL to their process group (the SDK's
shutdown), and the loop thread ends, which on Linux also kills any server still alive through
its death signal (see :mod:`workers.persona.mcp_connection`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sys
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import structlog

from workers.persona.mcp_calls import CallOutcome, McpToolInfo, McpUnavailable, for_the_model
from workers.persona.tool_config import McpServer
from workers.persona.waits import waiting

if TYPE_CHECKING:
    from workers.persona.mcp_connection import McpConnection

__all__ = ["McpHub"]

_log = structlog.get_logger("soulfleet.mcp")
_GRACE = 5.0
T = TypeVar("T")


def _default_errlog() -> TextIO:
    """Servers' stderr goes to ours (operators read it there) when ours is a real file."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return open(os.devnull, "w", encoding="utf-8")
    return sys.stderr


class McpHub:
    """Thread-safe access to this process's MCP servers."""

    def __init__(self, *, start_timeout: float = 30.0, errlog: TextIO | None = None) -> None:
        self.start_timeout = start_timeout
        self._errlog = errlog
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connections: dict[McpServer, McpConnection] = {}
        self._pid = os.getpid()
        self._closed = False

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not ours
                self._loop, self._thread, self._connections = None, None, {}
                self._pid, self._closed = os.getpid(), False
            if self._closed:
                raise McpUnavailable("the worker is shutting down")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._serve, args=(loop,), name="soulfleet-mcp", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _connection(self, server: McpServer) -> McpConnection:
        with self._lock:
            connection = self._connections.get(server)
            if connection is None:
                # The SDK loads here, on the first server a process starts, not at import.
                from workers.persona.mcp_connection import McpConnection  # noqa: PLC0415

                if self._errlog is None:
                    self._errlog = _default_errlog()
                connection = McpConnection(server, errlog=self._errlog)
                self._connections[server] = connection
            return connection

    def _submit(self, coro: Coroutine[Any, Any, T], wait: float) -> T:
        try:
            loop = self._running_loop()
        except McpUnavailable:
            coro.close()
            raise
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            with waiting():  # a server's start or answer: seconds, on the hub's own thread
                return future.result(wait)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise McpUnavailable(f"no answer from the MCP client within {wait:g}s") from None
        except concurrent.futures.CancelledError:  # close() cancelled it: the worker is stopping
            raise McpUnavailable("the worker is shutting down") from None

    def tools(self, server: McpServer, wait: float | None = None) -> tuple[McpToolInfo, ...]:
        """The server's tools, starting it if needed; McpUnavailable says why it cannot.
        ``wait``: the most seconds to wait for a start (default ``start_timeout``)."""
        found = self.tools_of([server], wait)[0]
        if isinstance(found, McpUnavailable):
            raise found
        return found

    def tools_of(
        self, servers: Sequence[McpServer], wait: float | None = None
    ) -> list[tuple[McpToolInfo, ...] | McpUnavailable]:
        """:meth:`tools` of several servers, started side by side: a turn declaring two slow
        servers waits for the slower, not for both in turn."""
        budget = self.start_timeout
        bound = budget if wait is None else min(wait, budget)
        connections = [self._connection(server) for server in servers]

        async def each(connection: McpConnection) -> tuple[McpToolInfo, ...] | McpUnavailable:
            try:
                return await connection.tools(budget, bound)
            except McpUnavailable as exc:
                return exc

        async def every() -> list[tuple[McpToolInfo, ...] | McpUnavailable]:
            return list(await asyncio.gather(*(each(c) for c in connections)))

        try:
            return self._submit(every(), bound + _GRACE)
        except McpUnavailable as exc:
            return [exc for _ in servers]

    def call(
        self, server: McpServer, tool: str, arguments: Mapping[str, Any], *, timeout: float
    ) -> CallOutcome:
        """Call ``tool`` on ``server``; never raises, never waits much past ``timeout``."""
        connection = self._connection(server)
        try:
            return self._submit(
                connection.call(tool, arguments, timeout=timeout, budget=self.start_timeout),
                timeout + _GRACE,
            )
        except McpUnavailable as exc:  # what the server printed stays out of the model's text
            reason = for_the_model(str(exc))
            return CallOutcome(f"error: {tool!r} was not run: {reason}", True, "unavailable")

    def starts(self, server: McpServer) -> int:
        """How many times this process started ``server`` (for tests and ``soulfleet tools``)."""
        with self._lock:
            connection = self._connections.get(server)
        return 0 if connection is None else connection.starts

    def close(self, timeout: float = 15.0) -> None:
        """Close every session and end the loop thread. Idempotent; later calls are refused."""
        with self._lock:
            loop, thread = self._loop, self._thread
            connections = list(self._connections.values())
            self._closed = True
            self._loop, self._thread = None, None
        if loop is None or thread is None or self._pid != os.getpid():
            return

        async def close_all() -> None:
            await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
            current = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not current:
                    task.cancel()

        future = asyncio.run_coroutine_threadsafe(close_all(), loop)
        try:
            future.result(timeout)
        except (concurrent.futures.TimeoutError, Exception) as exc:
            _log.warning("mcp.close_slow", error=type(exc).__name__, servers=len(connections))
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        _log.info("mcp.closed", servers=len(connections))

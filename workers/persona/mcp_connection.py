"""One MCP server connection: started on first use, restarted when it dies, every call bounded.

Lives entirely on the hub's event loop (:mod:`workers.persona.mcp_hub`): the SDK is asyncio,
and its transports and sessions are task-group based, so one *runner* task opens the transport
and the :class:`~mcp.ClientSession`, holds them open, and is the only task that closes them;
calls from many turns are other tasks on the same loop sharing that session (the SDK correlates
concurrent requests by id).

What the model and the operator can rely on:

- A call never raises and never outlives its timeout: a slow tool, a server that crashed
  mid-call, a protocol error or a server that cannot start each come back as a
  :class:`CallOutcome` error naming what happened and what happens next.
- A dead server is noticed (its stream ends) and restarted by the next call. Starts that keep
  failing back off (0 s, then 1, 2, 4 … up to 30 s) so a broken server costs a fast error
  result per call, not a process spawn per call; the first successful call resets it.
- A start has its own budget (the hub's ``start_timeout``), but no caller waits past its own
  bound for it: a turn listing tools waits what the turn allows, a call its ``timeout`` (the
  start included), and anyone at most 2 s for a server whose last start failed. A start a caller
  gave up on goes on for the callers after it.
- A timed-out call is cancelled (the SDK sends ``notifications/cancelled``) and the server is
  pinged: a server that answers stays (other turns' calls are in flight on it), one that does
  not is wedged and is restarted.
- How a server is spawned or reached (and why it never outlives its worker) is
  :mod:`workers.persona.mcp_transport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any, TextIO

import mcp_types
import structlog
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from workers.persona.mcp_calls import (
    CallOutcome,
    McpToolInfo,
    McpUnavailable,
    describe_error,
    for_the_model,
)
from workers.persona.mcp_transport import Watched, open_transport
from workers.persona.tool_config import McpServer

__all__ = ["McpConnection"]

_log = structlog.get_logger("soulfleet.mcp")

_BACKOFF_MAX = 30.0
_PROBE_MAX = 5.0
#: The most a caller waits for a start after the last start failed (see _ensure).
_RETRY_WAIT = 2.0


def _text_of(result: mcp_types.CallToolResult) -> str:
    if result.structured_content is not None and not result.is_error:
        return json.dumps(result.structured_content, ensure_ascii=False)
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:  # images, audio, resources: the model gets a note, never a blob it cannot read
            parts.append(f"[{block.type} content omitted]")
    return "\n".join(parts)


class McpConnection:
    """One server, one session at a time. Every method runs on the hub's loop."""

    def __init__(self, server: McpServer, *, errlog: TextIO) -> None:
        self.server = server
        self.label = server.describe()
        self._errlog = errlog
        self._session: ClientSession | None = None
        self._tools: tuple[McpToolInfo, ...] = ()
        self._starting: asyncio.Future[ClientSession] | None = None
        self._runner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        # While the runner waits for the server to open (the only wait close() may cancel: a
        # cancel landing in the SDK's teardown broke it, and the server's children outlived us).
        self._opening = False
        self._failures = 0
        #: starts that failed since the last one that worked (a server that died while
        #: running does not count: its restart is waited for like any start)
        self._failed_starts = 0
        self._retry_at = 0.0
        self.starts = 0
        self.last_error = ""

    # -- lifecycle ----------------------------------------------------------------------------
    async def tools(self, budget: float, wait: float | None = None) -> tuple[McpToolInfo, ...]:
        """The server's tools (listed at start); starts the server if needed (see _ensure)."""
        await self._ensure(budget, wait)
        return self._tools

    async def _ensure(self, budget: float, wait: float | None = None) -> ClientSession:
        """The session, starting the server if needed: the start gets ``budget`` seconds,
        the caller waits ``wait`` at most (None: the whole start). A caller that stops waiting
        leaves the start running for the callers after it. After a failed start the wait is
        :data:`_RETRY_WAIT` at most: a server that hangs at every start costs each turn that
        long, not a whole start budget."""
        if self._session is not None:
            return self._session
        loop = asyncio.get_running_loop()
        if wait is None:
            wait = budget
        if self._failed_starts:
            wait = min(wait, _RETRY_WAIT)
        if self._starting is None:
            backoff = self._retry_at - loop.time()
            if backoff > 0:
                raise McpUnavailable(f"{self.last_error} (next start attempt in {backoff:.1f}s)")
            self._starting = loop.create_future()
            # Retrieved here so a start nobody waits for any more never logs "never retrieved".
            self._starting.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._stop = asyncio.Event()
            self._runner = loop.create_task(self._run(self._starting, self._stop, budget))
        try:
            async with asyncio.timeout(wait):
                return await asyncio.shield(self._starting)
        except TimeoutError:
            raise McpUnavailable(
                f"still starting after {wait:g}s (it has {budget:g}s to start; once it is up "
                "its tools are offered again)"
            ) from None
        except McpUnavailable:
            raise
        except Exception as exc:  # the runner reports start failures as McpUnavailable
            raise McpUnavailable(str(exc) or type(exc).__name__) from exc

    async def _open(self, stack: AsyncExitStack, ended: asyncio.Event) -> ClientSession:
        read, write = await stack.enter_async_context(open_transport(self.server, self._errlog))
        session = await stack.enter_async_context(ClientSession(Watched(read, ended), write))
        await session.initialize()
        tools: list[McpToolInfo] = []
        cursor: str | None = None
        while True:
            params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
            listing = await session.list_tools(params=params)
            tools.extend(
                McpToolInfo(tool.name, tool.description or "", dict(tool.input_schema))
                for tool in listing.tools
            )
            cursor = listing.next_cursor
            if not cursor:
                break
        self._tools = tuple(tools)
        return session

    async def _open_within(
        self, budget: float, stack: AsyncExitStack, ended: asyncio.Event
    ) -> ClientSession:
        self._opening = True
        try:
            async with asyncio.timeout(budget):
                return await self._open(stack, ended)
        except TimeoutError:
            raise McpUnavailable(f"did not start within {budget:g}s") from None
        finally:
            self._opening = False

    async def _run(
        self, ready: asyncio.Future[ClientSession], stop: asyncio.Event, budget: float
    ) -> None:
        """Open, serve until stopped or the stream ends, close. The only task that closes."""
        ended = asyncio.Event()
        mine: ClientSession | None = None
        try:
            async with AsyncExitStack() as stack:
                session = await self._open_within(budget, stack, ended)
                mine = session
                self._session, self.starts, self._starting = session, self.starts + 1, None
                self._failed_starts = 0
                ready.set_result(session)
                _log.info("mcp.started", server=self.label, tools=len(self._tools))
                waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(ended.wait())]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
                self._forget(mine)
                if ended.is_set() and not stop.is_set():
                    self._died("the server closed the connection")
        except (Exception, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and stop.is_set():
                raise  # closed while starting (the worker or command is done): nothing failed
            problem = str(exc) if isinstance(exc, McpUnavailable) else describe_error(exc)
            if not ready.done():
                self._failed_starts += 1
                self._died(f"could not start: {problem}")
                ready.set_exception(McpUnavailable(self.last_error))
            elif not stop.is_set():
                self._died(problem)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._forget(mine)
            if self._starting is ready:
                self._starting = None
            if not ready.done():
                ready.set_exception(McpUnavailable("stopped while starting"))

    def _forget(self, session: ClientSession | None) -> None:
        # Only this runner's own session: after a restart a successor may be serving already
        # (this one still tearing its server down), and clearing its session orphaned it.
        if session is not None and self._session is session:
            self._session = None

    def _died(self, problem: str) -> None:
        self._failures += 1
        self.last_error = problem
        delay = 0.0 if self._failures <= 1 else min(_BACKOFF_MAX, 2.0 ** (self._failures - 2))
        self._retry_at = asyncio.get_running_loop().time() + delay
        _log.warning("mcp.down", server=self.label, error=problem, retry_in=delay)

    def _restart(self, session: ClientSession, why: str) -> None:
        """Drop ``session`` (if it is still the current one); the next call starts afresh."""
        if self._session is session:
            self._session = None
            self._died(why)
            self._stop.set()

    async def close(self) -> None:
        """Stop the runner (the SDK closes stdin, then TERM/KILLs the server's group)."""
        self._stop.set()
        runner = self._runner
        if runner is not None and not runner.done():
            if self._session is None and self._opening:  # nothing to wind down gracefully
                runner.cancel()
            # Else serving (stop ends it) or tearing a failed start down (the SDK's teardown,
            # bounded by its own timeouts, must finish: it kills the server's process group).
            with contextlib.suppress(BaseException):
                await runner

    # -- calls --------------------------------------------------------------------------------
    async def call(
        self, tool: str, arguments: Mapping[str, Any], *, timeout: float, budget: float
    ) -> CallOutcome:
        """Call ``tool``; never raises (except for the caller's own cancellation). ``timeout``
        bounds the whole call, a start of the server included."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            session = await self._ensure(budget, timeout)
        except McpUnavailable as exc:
            reason = for_the_model(str(exc))
            return CallOutcome(
                f"error: MCP server {self.label!r} is unavailable: {reason}. The tool was not run; "
                "try again later or do without it.",
                True,
                "unavailable",
            )
        left = timeout - (loop.time() - began)
        try:
            async with asyncio.timeout(max(0.0, left)):
                result = await session.call_tool(tool, dict(arguments))
        except TimeoutError:
            asyncio.get_running_loop().create_task(self._probe(session, timeout))
            return CallOutcome(
                f"error: tool {tool!r} did not answer within its {timeout:g}s timeout and was "
                "cancelled; its work may be incomplete.",
                True,
                "timeout",
            )
        except MCPError as exc:
            if exc.code != mcp_types.CONNECTION_CLOSED:
                return CallOutcome(f"error: {tool!r} failed: {exc.message}", True, "protocol_error")
            self._restart(session, f"connection closed during a call of {tool!r}")
            return self._died_during(tool)
        except Exception as exc:  # a transport failure: this session cannot be trusted any more
            self._restart(session, f"{describe_error(exc)} during a call of {tool!r}")
            return self._died_during(tool)
        self._failures = 0
        return CallOutcome(
            _text_of(result), bool(result.is_error), "tool_error" if result.is_error else None
        )

    def _died_during(self, tool: str) -> CallOutcome:
        return CallOutcome(
            f"error: MCP server {self.label!r} stopped during the call of {tool!r} (it crashed or "
            "hung up); it is restarted for a later call (after a pause of a few seconds when "
            "it keeps failing: its tools may be missing meanwhile). The call may or may not "
            "have taken effect.",
            True,
            "server_died",
        )

    async def _probe(self, session: ClientSession, timeout: float) -> None:
        """After a timeout: a server that still answers a ping stays, one that does not goes."""
        try:
            async with asyncio.timeout(min(timeout, _PROBE_MAX)):
                await session.send_ping()
        except Exception as exc:
            self._restart(
                session, f"no answer to a ping after a timed-out call ({describe_error(exc)})"
            )

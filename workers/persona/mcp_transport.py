"""How an MCP server is reached: a stdio child the worker spawns, or a streamable HTTP URL.

A stdio server runs in its own process group (the SDK kills the group when the session closes)
and, on Linux, behind a tiny launcher that sets ``PR_SET_PDEATHSIG``: the death signal survives
``execve``, so the server dies when the thread that spawned it (the hub's loop thread) ends,
even when the worker is SIGKILLed and never runs its shutdown. It gets only the SDK's safe
environment (PATH, HOME, …) plus its own ``env``, never the worker's secrets; ``${VAR}`` in
``env`` and ``headers`` values is read from the worker's environment, so tokens stay out of
persona files, and its stderr reaches ours with them masked (:mod:`workers.persona.mcp_stderr`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import re
import shutil
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, TextIO

import httpx2
from mcp import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from workers.persona.mcp_calls import STDERR_SAID, McpUnavailable, describe_error
from workers.persona.mcp_stderr import StderrRelay, secrets_for
from workers.persona.tool_config import McpServer

__all__ = [
    "MAX_HTTP_MESSAGE",
    "Watched",
    "expand",
    "open_transport",
    "referenced",
    "stdio_parameters",
]

# The SDK drops an HTTP session whose server sends one SSE event over 1 MiB. A big result should
# reach the result cap (a clear "too large" error the model can act on), so the transport only
# stops what no cap could make useful: one message over 64 MiB.
MAX_HTTP_MESSAGE = 64 * 1024 * 1024
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Run by the worker's own Python, then exec'd into the server (see the module docstring).
_LAUNCH = (
    "import ctypes,os,sys\n"
    "try:\n ctypes.CDLL(None,use_errno=True).prctl(1,9)\nexcept Exception:\n pass\n"
    "if os.getppid()!=int(sys.argv[1]):\n os._exit(70)\n"
    "os.execv(sys.argv[2],sys.argv[2:])\n"
)
_PDEATHSIG = platform.system() == "Linux"
# The relay of the stdio server whose transport the current task opened: the SDK's stdout
# reader runs in a task started inside it, so it sees the relay its noise belongs to.
_relay: ContextVar[StderrRelay | None] = ContextVar("soulfleet_mcp_relay", default=None)
_UNPARSED = "Failed to parse JSONRPC message from server"


class _StdoutNoise(logging.Filter):
    """The SDK logs a full pydantic traceback, unmasked, for every stdout line of a server that
    is not JSON-RPC (a start-up banner, a stray print): one line through the server's stderr
    relay instead (named, masked, rate-limited), or, outside a transport, one line without the
    server's text (it could hold a secret)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != _UNPARSED or not record.exc_info:
            return True
        error = record.exc_info[1]
        errors = getattr(error, "errors", None)
        found = errors()[0].get("input") if callable(errors) and errors() else None
        # Not JSON: the line itself; JSON that is no JSON-RPC message: what it parsed to.
        line = found if isinstance(found, str) else _shown(found)
        relay = _relay.get()
        if relay is not None:
            relay.stdout_line(line)
            return False
        record.msg = "an MCP server wrote a line on stdout that is not JSON-RPC; it was ignored"
        record.args = ()
        record.exc_info = None
        record.exc_text = None
        return True


def _shown(value: object) -> str:
    # Whole: the relay masks secrets before it cuts (a cut first could leave a secret's prefix).
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


logging.getLogger("mcp.client.stdio").addFilter(_StdoutNoise())


def expand(value: str) -> str:
    """``${VAR}`` from the worker's environment (tokens stay out of committed config)."""
    return _VAR.sub(lambda match: os.environ.get(match.group(1), ""), value)


def referenced(values: Iterable[str]) -> list[str]:
    """The variables ``${VAR}`` in ``values`` names: what :func:`expand` hands the server."""
    return [name for value in values for name in _VAR.findall(value)]


def _resolve(command: str) -> str:
    """The command's path: on PATH, or next to the worker's Python (a server installed into the
    same virtualenv works without activating it)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), os.path.dirname(sys.executable)])
    found = shutil.which(command, path=search)
    if found is None:
        hint = ""
        first, _, rest = command.strip().partition(" ")
        if rest and shutil.which(first, path=search) is not None:
            # `command = "mcp-server-time --local-timezone UTC"`: a shell line, not a command.
            hint = (
                f"; {first!r} is there: put its arguments in args, as in "
                f"command = {first!r} and args = {rest.split()!r}"
            )
        raise McpUnavailable(
            f"command {command!r} not found on PATH or next to {sys.executable}{hint}"
        )
    return os.path.abspath(found)


def stdio_parameters(server: McpServer) -> StdioServerParameters:
    """How the SDK spawns a stdio server: resolved command, own env, death signal on Linux."""
    command = _resolve(str(server.command))
    env = {name: expand(value) for name, value in server.env}
    if _PDEATHSIG:
        argv = ["-I", "-S", "-c", _LAUNCH, str(os.getpid()), command, *server.args]
        return StdioServerParameters(
            command=sys.executable, args=argv, env=env, encoding_error_handler="replace"
        )
    # "replace": one stdout line that is not UTF-8 (a banner) ended the session at start.
    return StdioServerParameters(
        command=command, args=list(server.args), env=env, encoding_error_handler="replace"
    )


@asynccontextmanager
async def open_transport(server: McpServer, errlog: TextIO) -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) streams to ``server``, closed (the server stopped) on exit."""
    if server.transport == "stdio":
        # Its stderr reaches ours through a relay that masks the worker's secrets.
        names = referenced(value for _, value in (*server.env, *server.headers))
        secrets = secrets_for(names, given=server.env)
        relay = StderrRelay(os.path.basename(str(server.command)), secrets, errlog)
        failed: Exception | None = None
        token = _relay.set(relay)
        try:
            async with stdio_client(stdio_parameters(server), errlog=relay.writer) as streams:
                yield streams
        except Exception as exc:
            failed = exc
        finally:
            with contextlib.suppress(ValueError):  # closed from another context than opened
                _relay.reset(token)
            relay.close()
            # The server has exited: let its last lines through before whoever reads our
            # stderr moves on (off the loop, which serves every other session meanwhile).
            await asyncio.to_thread(relay.join, 2.0)
        if failed is not None:
            if not relay.last_line or isinstance(_leaf(failed), McpUnavailable):
                raise failed
            # "Connection closed" alone does not say why a server died: what it said last does
            # (a traceback's last line, a usage error), masked like every line it writes. For
            # the operator (logs, `soulfleet tools`): the model is told without it.
            raise McpUnavailable(
                f"{describe_error(failed)}{STDERR_SAID}{relay.last_line!r})"
            ) from failed
        return
    headers = {name: expand(value) for name, value in server.headers}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http,
        streamable_http_client(
            str(server.url), http_client=http, max_sse_event_size=MAX_HTTP_MESSAGE
        ) as streams,
    ):
        yield streams


def _leaf(exc: BaseException) -> BaseException:
    """The one exception an anyio group wraps (the SDK's task groups wrap what they raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class Watched:
    """The transport's read stream, noting when it ends (the server died or hung up)."""

    def __init__(self, stream: Any, ended: asyncio.Event) -> None:
        self._stream = stream
        self._ended = ended

    async def receive(self) -> Any:
        try:
            return await self._stream.receive()
        except BaseException:
            self._ended.set()
            raise

    async def aclose(self) -> None:
        self._ended.set()
        await self._stream.aclose()

    def __aiter__(self) -> Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._stream.__anext__()
        except BaseException:
            self._ended.set()
            raise

    async def __aenter__(self) -> Watched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

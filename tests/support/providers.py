"""Real local HTTP servers that speak the OpenAI Chat Completions and Anthropic Messages wire
protocols, for testing the model clients and benchmarking the fleet without a paid model.

A :class:`FakeProvider` is a :class:`http.server.ThreadingHTTPServer` on 127.0.0.1 (port 0 by
default: the OS picks a free one) served from a background thread. Tests program it with a queue
of canned :class:`Reply` objects (status, headers, JSON or raw bytes, delay, or a dropped
connection) and read back every request it received (:class:`Recorded`: path, headers, parsed
body). With the queue empty it answers with ``respond(body)`` when one is set (a model that
reads the request, e.g. answers from the conversation history it was sent), else a plain text
completion after ``delay`` seconds, which is what a benchmark wants::

    python -m tests.support.providers openai --port 8765 --delay 2 --text HEARTBEAT_OK
    OPENAI_BASE_URL=http://127.0.0.1:8765/v1 SOULFLEET_MODEL=openai:fake soulfleet ...

Real sockets rather than a mock transport, so the clients' timeouts, connection handling and
headers are exercised exactly as against a provider.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

from workers.persona.clock import SystemClock

__all__ = [
    "FakeProvider",
    "ProviderKind",
    "Recorded",
    "RecordingClock",
    "Reply",
    "Served",
    "anthropic_error",
    "anthropic_message",
    "error_reply",
    "main",
    "openai_completion",
    "openai_error",
]

ProviderKind = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class Reply:
    """One canned answer. ``body`` is sent as JSON unless ``raw`` bytes are given."""

    status: int = 200
    body: Any = None
    raw: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    disconnect: bool = False  # close the connection without answering at all
    drip: float = 0.0  # seconds between the body's bytes, sent one at a time (a trickle)
    body_delay: float = 0.0  # seconds between the headers and the body


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it. Header names are lower-cased."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any  # the parsed JSON body, or None if it was not JSON
    raw: bytes


@dataclass(frozen=True)
class Served:
    """A 200 answer the server wrote to a client that was still there: what it billed."""

    body: Any  # the request's parsed JSON body
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int


class RecordingClock(SystemClock):
    """Real time, but ``sleep`` only records the wait: retry tests observe waits instantly."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


# -- wire-format builders ---------------------------------------------------------------------


def openai_completion(
    text: str | None = None,
    tool_calls: Sequence[tuple[str, str, Mapping[str, Any] | str]] = (),
    *,
    model: str = "fake",
    prompt_tokens: int = 11,
    completion_tokens: int = 7,
) -> dict[str, Any]:
    """A chat completion; ``tool_calls`` are (id, name, arguments: dict or raw JSON text)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(dict(args)),
                },
            }
            for call_id, name, args in tool_calls
        ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def anthropic_message(
    text: str | None = None,
    tool_uses: Sequence[tuple[str, str, Any]] = (),
    *,
    model: str = "fake",
    input_tokens: int = 13,
    output_tokens: int = 5,
) -> dict[str, Any]:
    """A Messages API answer; ``tool_uses`` are (id, name, input)."""
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    content.extend(
        {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}
        for call_id, name, tool_input in tool_uses
    )
    return {
        "id": f"msg_{uuid.uuid4().hex[:12]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if tool_uses else "end_turn",
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def openai_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def anthropic_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_reply(
    kind: ProviderKind, status: int, message: str, headers: Mapping[str, str] | None = None
) -> Reply:
    """An error answer in ``kind``'s own error format."""
    body = openai_error(message) if kind == "openai" else anthropic_error(message)
    return Reply(status=status, body=body, headers=dict(headers or {}))


# -- the server -------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's listen backlog is 5: a worker opening 200 connections at once overflowed
    # it, and the kernel's dropped handshakes turned into connect stalls of 1-30 s and resets
    # that no real provider would cause.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], provider: FakeProvider) -> None:
        super().__init__(address, _Handler)
        self.provider = provider

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up on a connection it had not read to the end (an answer it
        # refused, a timed-out try) resets it: a provider sees that every day, quietly.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keep-alive, as real providers do: the client's connection pool gets exercised.
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as a provider's front end sends: with Nagle's algorithm the body, written
    # after the headers, waited for the client's delayed ACK of them, 40 ms on every call
    # (the benchmarks' p50 turn carried it).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        server = self.server
        assert isinstance(server, _Server)
        server.provider._opened(self.connection)

    def finish(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        server.provider._closed(self.connection)
        super().finish()

    def do_POST(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        server.provider._handle(self)

    def do_GET(self) -> None:
        self.do_POST()  # answered with a 404 in the provider's error format

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read the recorded requests instead."""


class FakeProvider:
    """A programmable provider server; start with ``with FakeProvider("openai") as server:``."""

    def __init__(
        self,
        kind: ProviderKind,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        delay: float = 0.0,
        text: str = "ok",
        respond: Callable[[Any], Reply | Mapping[str, Any]] | None = None,
        answer: Callable[[Any], str | Mapping[str, Any]] | None = None,
        tokens: Callable[[Any], tuple[int, int]] | None = None,
    ) -> None:
        self.kind: ProviderKind = kind
        self.delay = delay
        self.text = text
        #: answers a request body when no canned reply is queued (None: the plain ``text``)
        self.respond = respond
        #: with the queue empty: the answer for a request body (default ``text``; a mapping is
        #: the whole JSON answer) and its (input, output) usage (default the builders' numbers)
        self.answer = answer
        self.tokens = tokens
        #: every 200 answer delivered to a live client, in order (the "bill")
        self.served: list[Served] = []
        #: request bodies whose client was gone (killed) when the answer was due: not billed
        self.dropped: list[Any] = []
        self._open = threading.Event()
        self._open.set()
        self._address = (host, port)
        self._lock = threading.Lock()
        self._replies: collections.deque[Reply] = collections.deque()
        self._requests: list[Recorded] = []
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._in_flight = 0
        #: the most requests this server was answering at one moment (the turn gate's witness)
        self.max_in_flight = 0
        #: TCP connections accepted so far (a client that reuses its connections opens few)
        self.connections_opened = 0

    # lifecycle

    def start(self) -> FakeProvider:
        self._server = _Server(self._address, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-{self.kind}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping in a delay
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        # Keep-alive connections outlive the listening socket: hang them up too, so a stopped
        # server is really gone for a client's connection pool.
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """What the client is configured with: ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``."""
        root = f"http://127.0.0.1:{self.port}"
        return f"{root}/v1" if self.kind == "openai" else root

    # programming and inspection

    def enqueue(self, *replies: Reply | Mapping[str, Any]) -> None:
        """Answer the next requests with these, in order (a mapping is a 200 JSON body)."""
        with self._lock:
            for reply in replies:
                self._replies.append(reply if isinstance(reply, Reply) else Reply(body=reply))

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    @property
    def bodies(self) -> list[Any]:
        return [request.body for request in self.requests]

    def pause(self) -> None:
        """Hold every answer not yet being written until :meth:`resume` (requests still
        arrive and are recorded). A client that died meanwhile gets nothing and is not billed."""
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    # serving

    def _opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)
            self.connections_opened += 1

    def _closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _default(self, body: Any) -> Reply:
        model = body.get("model", "fake") if isinstance(body, dict) else "fake"
        text = self.answer(body) if self.answer is not None else self.text
        if not isinstance(text, str):
            return Reply(body=dict(text), delay=self.delay)
        if self.kind == "openai":
            tokens_in, tokens_out = self.tokens(body) if self.tokens else (11, 7)
            payload = openai_completion(
                text, model=model, prompt_tokens=tokens_in, completion_tokens=tokens_out
            )
        else:
            tokens_in, tokens_out = self.tokens(body) if self.tokens else (13, 5)
            payload = anthropic_message(
                text, model=model, input_tokens=tokens_in, output_tokens=tokens_out
            )
        return Reply(body=payload, delay=self.delay)

    def _generated(self, body: Any) -> Reply:
        if self.respond is None:
            return self._default(body)
        made = self.respond(body)
        return made if isinstance(made, Reply) else Reply(body=made, delay=self.delay)

    def _route_ok(self, path: str) -> bool:
        path = path.split("?", 1)[0]
        if self.kind == "openai":
            return path.endswith("/chat/completions")
        return path == "/v1/messages"

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            self._answer(handler)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = Recorded(
            method=handler.command,
            path=handler.path,
            headers={name.lower(): value for name, value in handler.headers.items()},
            body=body,
            raw=raw,
        )
        with self._lock:
            self._requests.append(record)
            queued = self._replies.popleft() if self._replies else None
        if not self._route_ok(handler.path) or handler.command != "POST":
            reply = error_reply(self.kind, 404, f"no route {handler.command} {handler.path}")
        else:
            reply = queued if queued is not None else self._generated(body)
        if reply.delay > 0 and self._stopping.wait(reply.delay):
            handler.close_connection = True
            return
        while not self._open.wait(0.05):
            if self._stopping.is_set():
                handler.close_connection = True
                return
        if not reply.disconnect and _peer_gone(handler.connection):
            with self._lock:
                self.dropped.append(body)
            handler.close_connection = True
            return
        if reply.disconnect:
            handler.close_connection = True
            return
        if self._write(handler, reply) and reply.status == 200:
            self._bill(body, reply.body)

    def _write(self, handler: BaseHTTPRequestHandler, reply: Reply) -> bool:
        """Send ``reply``; whether all of it was written (a client gone leaves it unbilled)."""
        payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
        headers = {name.lower(): value for name, value in reply.headers.items()}
        headers.setdefault("content-type", "application/json")
        if headers.get("transfer-encoding") == "chunked":  # no length: 1 KiB chunks (a stream)
            pieces = [b"%x\r\n%s\r\n" % (len(payload[at : at + 1024]), payload[at : at + 1024])
                      for at in range(0, len(payload), 1024)] + [b"0\r\n\r\n"]  # fmt: skip
        else:
            if headers.get("connection") != "close":  # close: the body ends with the connection
                headers["content-length"] = str(len(payload))
            pieces = (
                [payload[at : at + 1] for at in range(len(payload))] if reply.drip else [payload]
            )
        try:
            handler.send_response(reply.status)
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.flush()
            if reply.body_delay and self._stopping.wait(reply.body_delay):
                handler.close_connection = True
                return False
            for piece in pieces:
                if reply.drip and self._stopping.wait(reply.drip):
                    handler.close_connection = True
                    return False
                handler.wfile.write(piece)
                handler.wfile.flush()
        except OSError:
            # The client gave up (timed out) before we answered: expected in timeout tests.
            handler.close_connection = True
            return False
        return True

    def _bill(self, request: Any, answer: Any) -> None:
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if not isinstance(usage, dict):
            return
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
        if self.kind == "openai":
            tokens_in, tokens_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        else:
            tokens_in = sum(
                usage.get(name, 0)
                for name in (
                    "input_tokens",
                    "cache_creation_input_tokens",
                    "cache_read_input_tokens",
                )
            )
            tokens_out = usage.get("output_tokens", 0)
            cached = usage.get("cache_read_input_tokens", 0)
        with self._lock:
            self.served.append(Served(request, int(tokens_in), int(tokens_out), int(cached)))


def _peer_gone(connection: socket.socket) -> bool:
    """Whether the client closed its end (a killed process): an answer would reach no one."""
    timeout = connection.gettimeout()
    try:
        connection.settimeout(0.0)
        return connection.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        with contextlib.suppress(OSError):
            connection.settimeout(timeout)


def serve(kind: ProviderKind, *, host: str, port: int, delay: float, text: str) -> FakeProvider:
    """Start a fake provider answering every request with ``text`` after ``delay`` seconds."""
    return FakeProvider(kind, host=host, port=port, delay=delay, text=text).start()


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.providers",
        description="Serve a fake model provider that answers every request with plain text.",
    )
    parser.add_argument("kind", choices=["openai", "anthropic"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--text", default="ok", help="the completion text")
    args = parser.parse_args(list(argv) if argv is not None else None)
    kind: ProviderKind = "openai" if args.kind == "openai" else "anthropic"
    server = serve(kind, host=args.host, port=args.port, delay=args.delay, text=args.text)
    print(
        f"fake {kind} provider on {server.base_url} (delay {args.delay:g}s); Ctrl-C stops",
        flush=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()

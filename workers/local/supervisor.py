"""Child-process supervision for ``soulfleet up``: start, watch, and stop in a safe order.

``up`` runs a small fleet on one machine: celery workers, a celery beat and optionally Flower,
above an embedded Redis. This module owns their processes, and three choices shape it:

- **Own sessions.** Every child gets its own session (``start_new_session``), so a Ctrl-C in
  the terminal reaches ``up`` alone. ``up`` then stops the children in ORDER, which a terminal
  signal to the whole group cannot do: beat first (no new ticks), then workers with a warm
  shutdown (a running turn may commit), then Flower; the caller stops Redis last, once nothing
  writes to it any more.
- **Deadlines, then force.** A warm shutdown waits for running turns; a stuck one must not keep
  ``up`` from exiting, so each stage has a deadline after which the child's whole process
  group is SIGKILLed (the lane's lease then expires and the reaper re-queues the turn: nothing
  is lost, it is only retried).
- **They die with it.** Each child gets a parent-death signal (:mod:`workers.local.lifeline`:
  SIGKILL by default, so a SIGKILLed ``up`` leaves no fleet behind) and inherits the data
  folder's lock (``keep_fds``), so a child that somehow survives still keeps a second ``up``
  off the folder.
- **Unexpected exits are loud.** :meth:`Supervisor.crashed` reports a child that exited while
  nobody asked it to, with the tail of its log, so ``up`` can stop the rest and exit non-zero
  instead of running half a fleet.

Each child's stdout and stderr go to its own log file (JSON lines with
``SOULFLEET_LOG_FORMAT=json``), which ``up`` tails to report events.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import structlog

from workers.local.lifeline import die_with_parent

__all__ = ["Child", "ChildSpec", "Supervisor", "readable"]

_log = structlog.get_logger("soulfleet.supervisor")
_POLL = 0.05


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to run one child. ``stage`` orders shutdown: lower stages stop first."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    cwd: Path | None = None
    stage: int = 0
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout: float = 10.0
    #: Sent by the kernel when ``up`` dies (None: the child may outlive it).
    parent_death_signal: signal.Signals | None = signal.SIGKILL


@dataclass
class Child:
    """One running child process and its log file."""

    spec: ChildSpec
    popen: subprocess.Popen[bytes]
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    #: Where this run's output starts in the (appended) log file.
    log_start: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signum)

    def kill_group(self) -> None:
        """SIGKILL the child's whole process group (it leads its own session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 15, max_bytes: int = 64 * 1024) -> str:
        """The last ``lines`` this child wrote (never lines of an earlier run's child)."""
        try:
            with self.spec.log_path.open("rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(self.log_start, size - max_bytes))
                text = log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(readable(line) for line in text.splitlines()[-lines:])

    def close(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


#: Longest value shown per field of a JSON log line in a crash report.
_FIELD_MAX = 160
#: Fields a reader of a crash report does not need (they repeat on every line).
_NOISE = frozenset({"event", "level", "log_level", "timestamp", "ts", "logger", "pid"})


def readable(line: str) -> str:
    """A JSON log line as ``level event key=value ...`` (values cut at 160 characters), for a
    person reading why a child died; any other line as it is."""
    if not line.startswith("{"):
        return line
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict) or "event" not in record:
        return line
    level = record.get("level") or record.get("log_level") or "-"
    fields = []
    for key, value in record.items():
        if key in _NOISE or value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        text = " ".join(text.split())
        if len(text) > _FIELD_MAX:
            text = text[: _FIELD_MAX - 3] + "..."
        fields.append(f"{key}={text}")
    return " ".join([str(level), str(record["event"]), *fields])


class Supervisor:
    """Starts children, notices unexpected exits, stops them stage by stage."""

    def __init__(self, keep_fds: Sequence[int] = ()) -> None:
        self.children: list[Child] = []
        self.stopping = False
        #: Descriptors every child inherits (the data folder's lock).
        self.keep_fds = tuple(keep_fds)

    def start(self, spec: ChildSpec) -> Child:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = spec.log_path.open("ab")
        log_start = log_file.seek(0, os.SEEK_END)
        try:
            popen = subprocess.Popen(
                list(spec.argv),
                env=dict(spec.env),
                cwd=str(spec.cwd) if spec.cwd else None,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                pass_fds=self.keep_fds,
                # Only prctl/getppid/kill run between fork and exec (libc loaded beforehand).
                preexec_fn=(  # noqa: PLW1509
                    die_with_parent(spec.parent_death_signal)
                    if spec.parent_death_signal is not None
                    else None
                ),
            )
        except BaseException:
            log_file.close()
            raise
        child = Child(spec=spec, popen=popen, _log_file=log_file, log_start=log_start)
        self.children.append(child)
        _log.info("child.started", child=spec.name, pid=popen.pid)
        return child

    def restart(self, crashed: Child) -> Child:
        """Start ``crashed``'s spec again in its place (its log file is appended to)."""
        index = self.children.index(crashed)
        crashed.close()
        child = self.start(crashed.spec)
        self.children.pop()  # start() appended it: keep its place, which orders the stop
        self.children[index] = child
        return child

    def pids(self) -> list[int]:
        return [child.pid for child in self.children]

    def crashed(self) -> Child | None:
        """The first child that exited on its own (None while all run or while stopping)."""
        if self.stopping:
            return None
        for child in self.children:
            if not child.running():
                return child
        return None

    def stop_all(
        self, *, force: bool = False, should_force: Callable[[], bool] | None = None
    ) -> list[tuple[str, int | None]]:
        """Stop every child, lowest stage first; return ``(name, exit code)`` in stop order.

        Within a stage all children are signalled at once and waited for together, so N
        workers finishing their turns take as long as the slowest, not the sum. ``force``
        skips the polite signal; ``should_force`` is polled while waiting (a second Ctrl-C)
        and, once true, kills whatever is still running.
        """
        self.stopping = True
        stopped: list[tuple[str, int | None]] = []
        for stage in sorted({child.spec.stage for child in self.children}):
            group = [child for child in self.children if child.spec.stage == stage]
            stopped += self._stop_group(group, force=force, should_force=should_force)
        return stopped

    def _stop_group(
        self, group: list[Child], *, force: bool, should_force: Callable[[], bool] | None
    ) -> list[tuple[str, int | None]]:
        for child in group:
            if child.running():
                if force:
                    child.kill_group()
                else:
                    child.signal(child.spec.stop_signal)
        deadline = time.monotonic() + max(child.spec.stop_timeout for child in group)
        while any(child.running() for child in group):
            forced = should_force is not None and should_force()
            if forced or time.monotonic() >= deadline:
                for child in group:
                    if child.running():
                        _log.warning("child.killed", child=child.name, pid=child.pid,
                                     reason="forced" if forced else "stop_timeout")  # fmt: skip
                        child.kill_group()
                break
            time.sleep(_POLL)
        for child in group:
            child.popen.wait(timeout=10)
            child.close()
        return [(child.name, child.popen.returncode) for child in group]

"""Real fleet processes for integration tests: celery workers and beat, started as subprocesses.

Each process writes JSON log lines (``SOULFLEET_LOG_FORMAT=json``) to its own file; tests read
the recorded events (``turn.start``, ``turn.end``, ``tick.emitted`` …) to check invariants.
Nothing here fakes Celery or Redis: these are the same commands an operator runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.providers import FakeProvider
from workers.fleet import Fleet
from workers.persona.edits import EDIT_GRACE_SECONDS
from workers.persona.inbox import InboxItem

__all__ = [
    "FleetProcess",
    "fleet_env",
    "openai_env",
    "post_past_the_door",
    "read_events",
    "settled",
    "soak_seconds",
    "spawn",
    "start_beat",
    "start_worker",
    "stop_all",
    "wait_until",
]

REPO = Path(__file__).resolve().parents[2]


def fleet_env(
    *,
    redis_url: str,
    key_prefix: str,
    personas: Path,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment a fleet process gets: this test's Redis, prefix and personas root."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SOULFLEET_", "CELERY_", "OPENAI_", "ANTHROPIC_"))
    }
    env.update(
        {
            "REDIS_URL": redis_url,
            "SOULFLEET_KEY_PREFIX": key_prefix,
            "SOULFLEET_QUEUE_PREFIX": key_prefix.rstrip(":").replace(":", "-"),
            "SOULFLEET_PERSONAS": str(personas),
            "SOULFLEET_LOG_FORMAT": "json",
            "SOULFLEET_LOG_LEVEL": "info",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("REDIS_URL_UNUSED", None)
    if extra:
        env.update(extra)
    return env


def openai_env(server: FakeProvider) -> dict[str, str]:
    """Settings that send every ``openai:`` model to ``server``, with no retry inside a call
    (so each request the server counts is one the turn made)."""
    return {
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "sk-test",
        "SOULFLEET_MODEL_RETRIES": "0",
    }


def read_events(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    """Every JSON log line in ``path`` (optionally only one event name); other lines skipped."""
    events: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return events
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and (event is None or record.get("event") == event):
            events.append(record)
    return events


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, interval: float = 0.1, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass
class FleetProcess:
    """A running celery worker or beat; its JSON log is ``log_path``."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log_file: Any = field(repr=False, default=None)

    def events(self, event: str | None = None) -> list[dict[str, Any]]:
        return read_events(self.log_path, event)

    def wait_for_event(self, event: str, *, timeout: float = 60.0) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}"
                )
            matches = self.events(event)
            return matches[0] if matches else None

        result: dict[str, Any] = wait_until(found, timeout=timeout, what=f"{self.name}: {event}")
        return result

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown, no acks, like a lost host."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)
        self._close()

    def stop(self, timeout: float = 30.0) -> None:
        stop_all([self], timeout=timeout)

    def terminate(self) -> None:
        """SIGTERM the process group (a warm shutdown); :meth:`stop` also waits."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)

    def _wait_or_kill(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=30)
        self._close()

    def _close(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def spawn(name: str, argv: list[str], env: Mapping[str, str], log_dir: Path) -> FleetProcess:
    """Start ``argv`` from the repository root in its own session, logging to ``<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_file = log_path.open("ab")
    popen = subprocess.Popen(
        argv,
        env=dict(env),
        cwd=str(REPO),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=log_file,
        start_new_session=True,
    )
    return FleetProcess(name=name, popen=popen, log_path=log_path, _log_file=log_file)


def start_worker(
    env: Mapping[str, str],
    log_dir: Path,
    *,
    name: str = "w1",
    queues: tuple[str, ...] = ("interactive", "heartbeat", "dream"),
    concurrency: int = 8,
    pool: str = "threads",
    wait: bool = True,
    app: str = "workers",
) -> FleetProcess:
    """Start ``celery -A workers worker`` serving ``queues`` (kinds) and wait until it is ready.

    ``app`` names another app module (e.g. :mod:`tests.support.crash_app`, the real app plus
    a fault)."""
    prefix = env["SOULFLEET_QUEUE_PREFIX"]
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "-n",
        f"{name}@%h",
        "-Q",
        ",".join(f"{prefix}.{kind}" for kind in queues),
        "-P",
        pool,
        "-c",
        str(concurrency),
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        "INFO",
    ]
    process = spawn(name, argv, env, log_dir)
    if wait:
        process.wait_for_event("worker.ready", timeout=60)
    return process


def start_beat(
    env: Mapping[str, str], log_dir: Path, *, name: str = "beat", wait: bool = True
) -> FleetProcess:
    """Start ``celery -A workers beat`` and wait for its first sweep."""
    argv = [sys.executable, "-m", "celery", "-A", "workers", "beat", "--loglevel", "INFO"]
    process = spawn(name, argv, env, log_dir)
    if wait:
        process.wait_for_event("sweep.done", timeout=60)
    return process


@contextlib.contextmanager
def running(*processes: FleetProcess) -> Iterator[tuple[FleetProcess, ...]]:
    """Stop every process on the way out, whatever the test did."""
    try:
        yield processes
    finally:
        stop_all(processes)


def stop_all(processes: Iterable[FleetProcess], timeout: float = 30.0) -> None:
    """Stop processes in parallel: SIGTERM every one, then wait for each against ONE deadline
    (a warm shutdown takes seconds, and N of them one after another would take N times that),
    SIGKILLing whoever is still up when it passes."""
    group = list(processes)
    for process in group:
        process.terminate()
    deadline = time.monotonic() + timeout
    for process in group:
        process._wait_or_kill(deadline - time.monotonic())


def soak_seconds(default: float) -> float:
    """A soak test's window: ``SOULFLEET_TEST_SOAK`` seconds when set, else ``default``.

    Shorter windows make a quick local loop; longer ones a nightly hunt for rare races."""
    raw = os.environ.get("SOULFLEET_TEST_SOAK", "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"SOULFLEET_TEST_SOAK must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"SOULFLEET_TEST_SOAK must be > 0, got {raw!r}")
    return value


def settled(home: Path) -> Path:
    """Stamp ``home`` and its files as last modified well before the edit grace of
    :mod:`workers.persona.edits`: a persona broken like this is broken, not being edited, so a
    turn failing on it is dead-lettered at once, as for a file nobody has touched for a while.
    Returns ``home``."""
    stamp = time.time() - 2 * EDIT_GRACE_SECONDS
    for path in [*home.iterdir(), home]:
        os.utime(path, (stamp, stamp), follow_symlinks=False)
    return home


def post_past_the_door(fleet: Fleet, persona: str, text: str) -> str:
    """Queue a turn for ``persona`` the way Fleet.post does, minus its check of the persona's
    files (which refuses an invalid persona): for tests of what a WORKER does with a persona
    whose files turned bad after a post. Returns the turn id."""
    outcome = fleet.lanes.post(persona, InboxItem.create(text, "tester", "api"), wake=True)
    assert outcome.turn_id is not None, outcome
    assert outcome.turn_kind is not None, outcome
    fleet.publisher.publish(persona, outcome.turn_id, outcome.turn_kind)
    return outcome.turn_id


def revive_past_the_door(fleet: Fleet, persona: str) -> str:
    """Revive ``persona``'s dead lane the way Fleet.revive does, minus its check of the
    persona's files (which refuses a persona still broken): for tests of what a worker does
    when a lane runs again while its files are bad (the files turned bad after the revive).
    Returns the turn id."""
    outcome = fleet.lanes.revive(persona)
    assert outcome.outcome == "queued", outcome
    assert outcome.turn_id is not None, outcome
    assert outcome.turn_kind is not None, outcome
    fleet.publisher.publish(persona, outcome.turn_id, outcome.turn_kind)
    return outcome.turn_id

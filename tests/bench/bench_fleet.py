"""Benchmark the fleet end to end against bare Celery, and PRINT one side-by-side table.

Run:  .venv/bin/python -m tests.bench.bench_fleet [--turns N] [--slow-turns N] [--latency S]
      [--warmup N] [--repeat R] [--pool P] [--concurrency N] [--seconds S] [--body] [--keep]

Each repeat measures three figures, each on a fresh real worker process started as the README
says (``celery -A ... worker -P <pool> -c <concurrency> -Q <the three queues>``, pool and
concurrency from :class:`Settings`, so the defaults unless ``--pool``/``--concurrency``; "cpu ms"
counts the pool's child processes too), each with its own
throwaway key and queue prefix, and ALL with the same method: the queue is filled with N
messages before the worker starts, and the clock runs from the ``--warmup``-th completion to
the last, so neither publishing nor the worker's start-up and warm-up is counted:

1. bare Celery: ``celery -A tests.bench.noop_app worker`` draining N no-op tasks (one Redis
   INCR each, which is how completions are counted): the ceiling Celery itself sets;
2. fleet turns with the scripted model answering at once: N personas whose ``persona.toml``
   says ``model = "scripted:rules.toml"``, one item posted to each (``Fleet.post``, so one turn
   message each) before ``celery -A workers worker`` starts;
3. fleet turns against a real local HTTP server speaking the OpenAI protocol that answers after
   ``--latency`` seconds (:class:`~tests.support.providers.FakeProvider`), at the default
   settings (no tuning): the figure should approach min(concurrency, gate) / latency. The
   provider counts the TCP connections it accepted: printed per 1,000 turns.

With ``--body``, a fourth figure: the scripted turns once more with no Celery at all, one after
another on one thread of one process (:mod:`tests.bench.turn_body`), and the bare task's CPU
over that turn body's, the most any delivery of today's turn could reach; and the ``fsync``
calls a turn makes (of files and of directories), counted there.

A turn is measured end to end: ``start.lua``, soul composition, the loop, transcript writes,
``finish.lua``. Rates are completions per second after warm-up; "p50 ms" is the median turn
duration the worker logged; "cpu ms" is the worker process's CPU per task or turn after
warm-up (``/proc``). Ratios (fleet / bare Celery, HTTP rate / ideal, p50 / latency) are taken
within each repeat, side by side, and printed as median (min-max) over the repeats.

Uses ``REDIS_URL`` if it answers, else starts its own redis-server; every key of the run is
deleted at the end and every process it started is stopped (process groups, try/finally).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import celery
import redis
import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.noop_app import NOOP_TASK, done_key, make_noop_app
from tests.support.fleet import REPO, fleet_env
from tests.support.providers import FakeProvider
from tests.support.redis import live_redis, reachable
from workers.fleet import Fleet
from workers.pools import POOLS
from workers.publisher import CeleryPublisher
from workers.queues import KINDS, queue_name
from workers.settings import Settings

__all__ = ["BenchError", "Result", "bench_noop", "bench_turns", "main", "warm_lanes"]

_POLL = 0.005


class BenchError(RuntimeError):
    """A phase could not be measured (worker died, deadline passed, a turn failed)."""


@dataclass(frozen=True, slots=True)
class Result:
    """One row of the table."""

    label: str
    count: int
    rate: float  # tasks or turns per second
    pool: str
    concurrency: int
    p50_ms: float | None = None
    cpu_ms: float | None = None  # worker process CPU per task or turn
    notes: tuple[str, ...] = ()


@dataclass
class _Worker:
    """One real ``celery worker`` in its own process group; its JSON log read incrementally."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    _offset: int = 0
    _partial: bytes = b""

    @classmethod
    def start(cls, name: str, app: str, env: Mapping[str, str], logs: Path) -> _Worker:
        settings = Settings.from_env(env)
        argv = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "-n", f"{name}@%h",
            "-Q", ",".join(queue_name(settings.queue_prefix, kind) for kind in KINDS),
            "-P", settings.worker_pool, "-c", str(settings.worker_concurrency),
            "--without-mingle", "--without-gossip", "--loglevel", "INFO",
        ]  # fmt: skip
        log_path = logs / f"{name}.log"
        log_file = log_path.open("ab")
        popen = subprocess.Popen(
            argv, env=dict(env), cwd=str(REPO), stdin=subprocess.DEVNULL,
            stdout=log_file, stderr=log_file, start_new_session=True,
        )  # fmt: skip
        return cls(name, popen, log_path, log_file)

    def events(self) -> list[dict[str, Any]]:
        """JSON log records written since the last call (complete lines only)."""
        with self.log_path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        fresh: list[dict[str, Any]] = []
        for line in lines:
            if not line.startswith(b"{"):
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    fresh.append(record)
        return fresh

    def cpu_seconds(self) -> float | None:
        """User + system CPU the worker has used so far: its process and, with the prefork
        pool, its pool children (Linux ``/proc``; else None)."""
        stats = [_stat_fields(pid) for pid in _group(self.popen.pid)]
        ticks = [int(fields[11]) + int(fields[12]) for fields in stats if fields]
        return sum(ticks) / os.sysconf("SC_CLK_TCK") if ticks else None

    def check(self, deadline: float, what: str) -> None:
        """Raise :class:`BenchError` with the log tail if the worker died or time is up."""
        if self.popen.poll() is not None:
            raise self.error(f"{self.name} exited with {self.popen.returncode} during {what}")
        if time.monotonic() > deadline:
            raise self.error(f"{self.name}: {what} did not finish in time (see --seconds)")

    def error(self, message: str) -> BenchError:
        tail = self.log_path.read_text(errors="replace").splitlines()[-30:]
        header = f"--- last lines of {self.log_path.name} (--keep keeps the whole log) ---"
        return BenchError("\n".join([message, header, *tail]))

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("event") == "worker.ready" for e in self.events()):
            self.check(deadline, "start-up (waiting for worker.ready)")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM the process group (warm shutdown), SIGKILL it if that takes too long."""
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            if self.popen.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=wait)
        # Children the worker left behind in its group (none expected) go too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.log_file.close()


@contextlib.contextmanager
def _worker(
    name: str, app: str, env: Mapping[str, str], logs: Path, *, wait: bool = True
) -> Iterator[_Worker]:
    worker = _Worker.start(name, app, env, logs)
    try:
        if wait:
            worker.wait_ready(timeout=60)
        yield worker
    finally:
        worker.stop()


def bench_noop(
    env: Mapping[str, str], logs: Path, *, tasks: int, warmup: int, seconds: float
) -> Result:
    """Fill the queue with ``tasks`` no-op tasks, start a no-op worker, time how fast it drains.

    The clock runs from the ``warmup``-th executed task to the last.
    """
    settings = Settings.from_env(env)
    app = make_noop_app(settings)
    client = redis.Redis.from_url(settings.redis_url)
    key = done_key(settings)
    try:
        client.delete(key)
        with app.producer_or_acquire() as producer:
            for _ in range(tasks):
                app.send_task(NOOP_TASK, producer=producer, ignore_result=True)
        with _worker("noop", "tests.bench.noop_app", env, logs, wait=False) as worker:
            deadline = time.monotonic() + 60 + seconds  # start-up, then the run
            first: tuple[float, int, float | None] | None = None
            while True:
                done = int(client.get(key) or 0)
                now = time.perf_counter()
                if done >= warmup and first is None:
                    first = (now, done, worker.cpu_seconds())
                if done >= tasks:
                    break
                worker.check(deadline, f"{tasks} no-op tasks ({done} done)")
                time.sleep(_POLL)
            cpu_end = worker.cpu_seconds()
    finally:
        client.close()
        app.close()
    assert first is not None
    if now <= first[0] or first[1] >= tasks:
        raise BenchError(f"all {tasks} no-op tasks ran between two polls: raise --turns")
    return Result(
        "bare Celery no-op task",
        tasks,
        (tasks - first[1]) / (now - first[0]),
        settings.worker_pool,
        settings.worker_concurrency,
        cpu_ms=_per_op(first[2], cpu_end, tasks - first[1]),
    )


def _write_personas(root: Path, count: int, *, scripted: bool) -> list[str]:
    names = [f"p{i:05d}" for i in range(count)]
    for name in names:
        home = root / name
        home.mkdir(parents=True)
        (home / "SOUL.md").write_text(f"You are {name}.\n", encoding="utf-8")
        if scripted:
            (home / "rules.toml").write_text('[[rules]]\ntext = "ok"\n', encoding="utf-8")
            (home / "persona.toml").write_text('model = "scripted:rules.toml"\n', encoding="utf-8")
    return names


def bench_turns(
    label: str,
    worker_name: str,
    env: Mapping[str, str],
    logs: Path,
    names: Sequence[str],
    *,
    warmup: int,
    seconds: float,
    profile: float = 0.0,
) -> Result:
    """One turn for each of ``names``, all queued before a fresh ``celery -A workers`` starts.

    With ``profile`` seconds, py-spy samples the worker (GIL holder only: CPU, not waits) once
    it is past the warm-up, and the top functions are printed (py-spy must be on PATH)."""
    settings = Settings.from_env(env)
    total = len(names)
    _post_each(env, names, "bench")
    with _worker(worker_name, "workers", env, logs, wait=False) as worker:
        deadline = time.monotonic() + 60 + seconds
        ends: list[dict[str, Any]] = []
        cpu_first: float | None = None
        spy: subprocess.Popen[bytes] | None = None
        while len(ends) < total:
            fresh = worker.events()
            for event in fresh:
                if event.get("event") != "turn.end":
                    continue
                if event.get("status") != "done" or event.get("items") != 1:
                    raise worker.error(f"turn did not end as benchmarked: {event}")
                ends.append(event)
            if cpu_first is None and len(ends) >= warmup:
                cpu_first, ended_first = worker.cpu_seconds(), len(ends)
                if profile > 0:
                    spy = _spy(worker.popen.pid, profile, logs / f"{worker_name}.spy")
            if not fresh:
                worker.check(deadline, f"{total} turns ({len(ends)} done)")
                time.sleep(_POLL)
        cpu_end = worker.cpu_seconds()
        if profile > 0 and spy is not None:
            spy.wait(timeout=profile + 30)
            _say(f"{label}: top functions (py-spy --gil, inclusive share of samples):\n"
                 + _top(logs / f"{worker_name}.spy"))  # fmt: skip
    at = sorted(float(e["at"]) for e in ends)
    if at[-1] <= at[warmup]:
        raise BenchError(f"{label}: every turn ended at once: raise --turns")
    p50 = statistics.median(float(e["seconds"]) for e in ends[warmup:]) * 1000
    return Result(
        label,
        total,
        (total - 1 - warmup) / (at[-1] - at[warmup]),
        settings.worker_pool,
        settings.worker_concurrency,
        p50_ms=p50,
        cpu_ms=_per_op(cpu_first, cpu_end, total - ended_first),
    )


def warm_lanes(
    worker_name: str, env: Mapping[str, str], logs: Path, names: Sequence[str], *, seconds: float
) -> None:
    """One turn for each of ``names`` on a worker of its own, stopped once all have ended: the
    lanes' directories, sessions and transcript files then exist, as in a running fleet, and
    the turn measured next continues a session (``--warm-lanes``)."""
    _post_each(env, names, "warm")
    with _worker(worker_name, "workers", env, logs, wait=False) as worker:
        deadline = time.monotonic() + 60 + seconds
        ended = 0
        while ended < len(names):
            fresh = worker.events()
            ended += sum(1 for event in fresh if event.get("event") == "turn.end")
            if not fresh:
                worker.check(deadline, f"warming {len(names)} lanes ({ended} done)")
                time.sleep(_POLL)


def bench_body(
    env: Mapping[str, str], logs: Path, names: Sequence[str], *, warmup: int, seconds: float
) -> Result:
    """One turn for each of ``names`` run in one process on one thread with no Celery at all
    (:mod:`tests.bench.turn_body`): the CPU a turn's own work costs (``--body``)."""
    argv = [sys.executable, "-m", "tests.bench.turn_body", str(warmup), *names]
    with (logs / "body.log").open("ab") as log:
        done = subprocess.run(
            argv, env=dict(env), cwd=str(REPO), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=log, timeout=60 + seconds, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        tail = (logs / "body.log").read_text(errors="replace").splitlines()[-20:]
        raise BenchError("\n".join([f"turn body exited with {done.returncode}", *tail]))
    figures = json.loads(done.stdout)
    fsyncs = figures["fsyncs"]
    return Result(
        "fleet turn body, 1 thread, no Celery",
        int(figures["turns"]),
        float(figures["rate"]),
        "none",
        1,
        cpu_ms=float(figures["cpu_ms"]),
        notes=(
            f"fsyncs per turn: {fsyncs['files'] + fsyncs['directories']:.2f} "
            f"({fsyncs['files']:.2f} of files, {fsyncs['directories']:.2f} of directories)",
        ),
    )


def _post_each(env: Mapping[str, str], names: Sequence[str], text: str) -> None:
    """Post ``text`` to each of ``names`` (one turn message each), before a worker starts."""
    settings = Settings.from_env(env)
    publisher = CeleryPublisher(settings)
    fleet = Fleet(settings, publisher=publisher)
    try:
        for name in names:
            fleet.post(name, text, sender="bench", channel="bench", wake=True)
    finally:
        fleet.client.close()
        publisher.app.close()


def _spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy recording ``pid`` for ``seconds`` (raw collapsed stacks), or None without py-spy."""
    binary = shutil.which("py-spy")
    if binary is None:
        _say("--profile: py-spy is not on PATH (pip install py-spy); no profile")
        return None
    argv = [binary, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "250", "--gil",
            "--nonblocking", "--format", "raw", "-o", str(out)]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# Frames every sample passes through (thread pool, Celery's tracer, the worker's start-up).
_SCAFFOLD = frozenset({
    "_worker", "_WorkItem.run", "apply_target", "fast_trace_task",
    "build_tracer.<locals>.trace_task", "_install_stack_protection.<locals>.__protected_call__",
    "Command.__call__", "Command.main",
    "Command.invoke", "Group.invoke", "Context.invoke", "WorkController.start", "asynloop",
    "pass_context.<locals>.new_func", "Evloop.start", "worker", "Consumer.start", "main",
    "handle_preload_options.<locals>.caller", "Hub.create_loop", "<module>", "Blueprint.start",
    "StartStopStep.start", "_run_code", "_run_module_as_main", "Thread.run", "Thread._bootstrap",
    "Thread._bootstrap_inner", "turn",
})  # fmt: skip


def _top(path: Path, count: int = 25) -> str:
    """The functions in the most samples (inclusive), from py-spy's raw output."""
    try:
        text = path.read_text()
    except OSError:
        return "  (no profile written)"
    shares: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        total += int(n)
        for frame in set(stack.split(";")):
            name = frame.split(" (", 1)[0]
            where = frame.rsplit("/", 1)[-1].split(":", 1)[0] if "(" in frame else ""
            key = f"{name} ({where})"
            shares[key] = shares.get(key, 0) + int(n)
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])
    lines = [f"  {n * 100 / max(1, total):5.1f}% {k}" for k, n in ranked
             if k.split(" (", 1)[0] not in _SCAFFOLD][:count]  # fmt: skip
    return "\n".join(lines)


class _Monitor:
    """Every command Redis executes while it runs (``MONITOR``), on a thread of its own."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url)
        self.commands: list[tuple[float, str, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._client.monitor() as monitor:  # type: ignore[no-untyped-call]
            self._ready.set()
            in_multi = False
            while not self._stop:
                command = monitor.next_command()
                if command.get("client_type") == "lua":
                    continue  # run inside a script: no round trip of its own
                name = str(command["command"]).split(" ", 1)[0].upper()
                # A MULTI ... EXEC block goes out as one pipelined round trip.
                if name == "MULTI":
                    in_multi = True
                elif name == "EXEC":
                    in_multi = False
                    name = "MULTI/EXEC"
                if not in_multi:
                    port = str(command.get("client_port", ""))
                    self.commands.append((time.time(), port, name))

    def __enter__(self) -> _Monitor:
        self._ready = threading.Event()
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop = True
        with contextlib.suppress(redis.RedisError):
            redis.Redis.from_url(self._url()).ping()  # wakes the monitor for its last read
        self._thread.join(timeout=5)
        self._client.close()

    def _url(self) -> str:
        kwargs = self._client.connection_pool.connection_kwargs
        return f"redis://{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}"

    def between(self, start: float, end: float, ports: set[str]) -> list[str]:
        """Commands seen in [start, end] from connections with one of these local ports."""
        return [
            name for at, port, name in list(self.commands) if start <= at <= end and port in ports
        ]


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name (state, ppid, pgrp, ...); [] if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[1].split()  # the command name may contain spaces


def _group(leader: int) -> list[int]:
    """The live processes of ``leader``'s process group (a worker started in its own session:
    the worker and, with the prefork pool, its children)."""
    try:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return [leader]
    return [pid for pid in pids if (fields := _stat_fields(pid)) and int(fields[2]) == leader]


def _local_ports(leader: int) -> set[str]:
    """Local TCP ports of the sockets of ``leader``'s process group (Linux ``/proc``): which
    Redis clients are the worker's, its prefork children's included."""
    inodes: set[str] = set()
    for pid in _group(leader):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports: set[str] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{leader}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(str(int(fields[1].rsplit(":", 1)[1], 16)))
    return ports


def round_trips(
    env: Mapping[str, str],
    logs: Path,
    name: str,
    *,
    app: str,
    go: Callable[[], object],
    done: Callable[[], int] | None = None,
) -> tuple[float, dict[str, int]]:
    """Redis commands one task or turn costs, counted with MONITOR on an otherwise idle worker.

    Only the worker process's own connections count (their local ports, from ``/proc``), so
    the publishing side is left out; its idle traffic (the BRPOP loop) over an equal window
    before ``go`` is subtracted. The count runs until the worker logged that the task
    finished, plus a short tail (the ack).
    """
    settings = Settings.from_env(env)
    # A turn logs turn.end; a no-op task logs nothing (Celery's per-task lines are debug-only),
    # so ``done`` counts its completions instead.
    target = [0]

    def finished() -> bool:
        if done is not None:
            return done() >= target[0]
        return any(e.get("event") == "turn.end" for e in worker.events())

    with _worker(name, app, env, logs) as worker, _Monitor(settings.redis_url) as monitor:
        deadline = time.monotonic() + 60
        target[0] = 1
        go()  # warm-up: the first task opens the worker's connections and loads its scripts
        while not finished():
            worker.check(deadline, "the warm-up task")
            time.sleep(_POLL)
        time.sleep(2.0)
        worker.events()
        began = time.time()
        target[0] = 2
        go()
        while not finished():
            worker.check(deadline, "one task")
            time.sleep(_POLL)
        time.sleep(0.3)
        ended = time.time()
        ports = _local_ports(worker.popen.pid)
        window = ended - began
        idle = monitor.between(began - window - 0.5, began - 0.5, ports)
        busy = monitor.between(began, ended, ports)
    counts: dict[str, int] = {}
    for command in busy:
        counts[command] = counts.get(command, 0) + 1
    return len(busy) - len(idle), counts


def _per_op(start: float | None, end: float | None, count: int) -> float | None:
    if start is None or end is None or count <= 0:
        return None
    return (end - start) * 1000 / count


def _clean(url: str, prefix: str) -> int:
    """Delete every key under ``prefix``; return how many keys match it afterwards."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=5000))
        for start in range(0, len(keys), 5000):
            client.unlink(*keys[start : start + 5000])
        return sum(1 for _ in client.scan_iter(match=f"{prefix}*", count=5000))
    finally:
        client.close()


def _spread(values: Sequence[float], fmt: str = ",.1f") -> str:
    """``median (min-max)`` of ``values``."""
    mid = statistics.median(values)
    if len(values) == 1:
        return format(mid, fmt)
    return f"{mid:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


@dataclass
class _Repeat:
    """One repeat's three rows and what the HTTP model server saw."""

    noop: Result
    fast: Result
    slow: Result
    ideal: float
    connections: int
    max_in_flight: int
    latency: float
    body: Result | None = None


def _bound(repeats: Sequence[_Repeat]) -> list[str]:
    """With ``--body``: the bare task's CPU over the turn body's, the drain-rate ratio a
    CPU-bound worker could reach if Celery cost a turn nothing (every turn in one message)."""
    pairs = [(r.noop.cpu_ms, r.body.cpu_ms) for r in repeats if r.body is not None]
    bounds = [noop / body for noop, body in pairs if noop is not None and body]
    if not bounds:
        return []
    lines = [
        f"  bare no-op cpu / turn body cpu (1 thread, no Celery): {_spread(bounds, '.2f')}   "
        "(the most a CPU-bound worker can reach with today's turn, whatever delivers it)"
    ]
    # The same in every repeat: what a turn writes durably does not depend on load.
    notes = [r.body.notes[0] for r in repeats if r.body is not None and r.body.notes]
    return [*lines, f"  turn body, {notes[0]}"] if notes else lines


def _table(repeats: Sequence[_Repeat], setup: str) -> str:
    header = f"{'':<34} {'per s':>24} {'p50 ms':>22} {'cpu ms':>18}"
    lines = [setup, header, "-" * len(header)]
    attrs = ("noop", "fast", "body", "slow") if repeats[0].body else ("noop", "fast", "slow")
    for attr in attrs:
        rows: list[Result] = [getattr(r, attr) for r in repeats]
        p50 = "-" if rows[0].p50_ms is None else _spread([r.p50_ms or 0.0 for r in rows])
        cpus = [r.cpu_ms for r in rows if r.cpu_ms is not None]
        cpu = _spread(cpus, ",.2f") if cpus else "-"
        lines.append(
            f"{rows[0].label:<34} {_spread([r.rate for r in rows]):>24} {p50:>22} {cpu:>18}"
        )
    slow = repeats[0].slow
    ratio = _spread([r.fast.rate / r.noop.rate for r in repeats], ".2f")
    ideal = _spread([r.slow.rate / r.ideal for r in repeats], ".2f")
    p50 = _spread([(r.slow.p50_ms or 0.0) / 1000 / r.latency for r in repeats], ".2f")
    per_1000 = _spread([r.connections * 1000 / r.slow.count for r in repeats], ",.0f")
    lines += [
        "ratios, taken within each repeat (median (min-max)):",
        f"  fleet turn (scripted 0 ms) / bare Celery no-op drain rate: {ratio}   (goal >= 0.5)",
        *_bound(repeats),
        f"  fleet turn (HTTP {repeats[0].latency:g} s) / ideal {repeats[0].ideal:,.1f} turns/s "
        f"(min(concurrency {slow.concurrency}, gate) / latency): {ideal}   (goal >= 0.9)",
        f"  p50 turn / model latency: {p50}   (goal <= 1.1)",
        f"  model connections opened per 1,000 turns: {per_1000}; most calls in flight at once: "
        f"{max(r.max_in_flight for r in repeats)}",
        "per s: completions per second from the warm-up-th to the last; p50 ms: median turn "
        "duration in the worker; cpu ms: worker process CPU (user+sys) per task or turn",
    ]
    return "\n".join(lines)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.bench_fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--turns", type=int, default=2000, help="no-op tasks and scripted turns (default 2000)")
    add("--slow-turns", type=int, default=None, help="turns at --latency (default 6 x concurrency)")
    add("--latency", type=float, default=2.0, help="HTTP model latency in seconds (default 2)")
    add("--warmup", type=int, default=None, help="completions not timed (default turns / 10)")
    add("--repeat", type=int, default=3, help="repeats of the three phases (default 3)")
    add(
        "--pool",
        choices=POOLS,
        default=None,
        help="SOULFLEET_WORKER_POOL for every worker, bare and fleet (default: unset)",
    )
    add(
        "--concurrency",
        type=int,
        default=None,
        help="SOULFLEET_WORKER_CONCURRENCY (default: unset)",
    )
    add("--seconds", type=float, default=120.0, help="give up on a phase after this (default 120)")
    add(
        "--warm-lanes",
        action="store_true",
        help="measure each persona's SECOND turn (a continuing session, as in a running fleet): "
        "an unmeasured worker runs a first turn on every lane before the measured one",
    )
    add(
        "--body",
        action="store_true",
        help="also run the scripted turns in one process on one thread with no Celery, and "
        "print the bare task's CPU over that turn body's CPU: the ratio no execution model that "
        "keeps today's turn (several turns per message included) can pass",
    )
    add("--baton", choices=("on", "off"), default="on",
        help="the worker's turn baton (SOULFLEET_TURN_BATON; default on)")  # fmt: skip
    add("--keep", action="store_true", help="keep the scratch directory (worker logs, personas)")
    add("--profile", type=float, default=0.0,
        help="py-spy the scripted and HTTP workers this many seconds (first repeat)")  # fmt: skip
    args = parser.parse_args(argv)
    for name in ("turns", "slow_turns", "concurrency", "repeat"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.latency <= 0:
        parser.error("--latency must be > 0")
    return args


@dataclass(frozen=True)
class _Run:
    """One benchmark run: its Redis, its key prefix (every phase below it), its scratch space."""

    url: str
    prefix: str
    scratch: Path
    extra: Mapping[str, str]

    @property
    def logs(self) -> Path:
        return self.scratch / "logs"

    def env(
        self, phase: str, personas: Path, more: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """A fleet environment with the phase's own key and queue prefix."""
        personas.mkdir(parents=True, exist_ok=True)
        return fleet_env(
            redis_url=self.url,
            key_prefix=f"{self.prefix}{phase}:",
            personas=personas,
            extra={**self.extra, **(more or {})},
        )


def _say(message: str) -> None:
    print(f"bench_fleet: {message}", file=sys.stderr, flush=True)


def _repeat(run: _Run, args: argparse.Namespace, settings: Settings, n: int) -> _Repeat:
    run.logs.mkdir(parents=True, exist_ok=True)
    warmup = args.warmup if args.warmup is not None else args.turns // 10
    _say(f"[{n}] bare Celery, {args.turns} no-op tasks ...")
    noop_env = run.env(f"noop{n}", run.scratch / "no-personas")
    noop = bench_noop(noop_env, run.logs, tasks=args.turns, warmup=warmup, seconds=args.seconds)

    root = run.scratch / f"scripted{n}"
    names = _write_personas(root, args.turns, scripted=True)
    env = run.env(f"fast{n}", root)
    if args.warm_lanes:
        _say(f"[{n}] fleet, warming {args.turns} lanes (one unmeasured turn each) ...")
        warm_lanes(f"fast{n}-warm", env, run.logs, names, seconds=args.seconds)
    _say(f"[{n}] fleet, {args.turns} turns, scripted model 0 ms ...")
    fast = bench_turns("fleet turn, scripted model 0 ms", f"fast{n}", env, run.logs, names,
                       warmup=warmup, seconds=args.seconds,
                       profile=args.profile if n == 0 else 0.0)  # fmt: skip
    body = None
    if args.body:
        root = run.scratch / f"body{n}"
        names = _write_personas(root, args.turns, scripted=True)
        env = run.env(f"body{n}", root)
        if args.warm_lanes:
            _say(f"[{n}] turn body, warming {args.turns} lanes (one unmeasured turn each) ...")
            warm_lanes(f"body{n}-warm", env, run.logs, names, seconds=args.seconds)
        _say(f"[{n}] turn body, {args.turns} scripted turns in one thread, no Celery ...")
        body = bench_body(env, run.logs, names, warmup=warmup, seconds=args.seconds)

    turns = args.slow_turns or 6 * settings.worker_concurrency
    root = run.scratch / f"http{n}"
    names = _write_personas(root, turns, scripted=False)
    _say(f"[{n}] fleet, {turns} turns, HTTP model {args.latency:g} s ...")
    with FakeProvider("openai", delay=args.latency, text="ok") as provider:
        env = run.env(
            f"slow{n}",
            root,
            {"SOULFLEET_MODEL": "openai:fake", "OPENAI_BASE_URL": provider.base_url},
        )
        if args.warm_lanes:
            _say(f"[{n}] fleet, warming {turns} lanes (one unmeasured turn each) ...")
            warm_lanes(f"slow{n}-warm", env, run.logs, names, seconds=args.seconds)
        opened = provider.connections_opened  # the measured worker's connections only
        slow = bench_turns(f"fleet turn, HTTP model {args.latency:g} s", f"slow{n}", env,
                           run.logs, names, warmup=turns // 10, seconds=args.seconds,
                           profile=args.profile if n == 0 else 0.0)  # fmt: skip
        gate = Settings.from_env(env).max_concurrent_model_calls
        slots = min(settings.worker_concurrency, gate) if gate else settings.worker_concurrency
        return _Repeat(noop, fast, slow, slots / args.latency, provider.connections_opened - opened,
                       provider.max_in_flight, args.latency, body)  # fmt: skip


def _trips(run: _Run) -> str:
    """One no-op task and one fleet turn, each on an idle worker, counted with MONITOR."""
    _say("Redis commands for one no-op task and one fleet turn (MONITOR) ...")
    env = run.env("trips-noop", run.scratch / "no-personas")
    settings = Settings.from_env(env)
    app = make_noop_app(settings)
    counter = redis.Redis.from_url(settings.redis_url)
    try:
        noop, noop_by = round_trips(
            env, run.logs, "trips-noop", app="tests.bench.noop_app",
            go=lambda: app.send_task(NOOP_TASK, ignore_result=True),
            done=lambda: int(counter.get(done_key(settings)) or 0),
        )  # fmt: skip
    finally:
        app.close()
        counter.close()
    root = run.scratch / "trips"
    names = _write_personas(root, 1, scripted=True)
    env = run.env("trips-turn", root)
    settings = Settings.from_env(env)
    publisher = CeleryPublisher(settings)
    fleet = Fleet(settings, publisher=publisher)
    try:
        turn, turn_by = round_trips(env, run.logs, "trips-turn", app="workers",
                                    go=lambda: fleet.post(names[0], "bench", sender="bench",
                                                          channel="bench", wake=True))  # fmt: skip
    finally:
        fleet.client.close()
        publisher.app.close()

    def detail(counts: Mapping[str, int]) -> str:
        return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda x: -x[1]))

    return (
        "  Redis round trips per task (MONITOR after a warm-up task; the worker's connections "
        "only, idle polling subtracted, script commands and MULTI blocks counted once): "
        f"bare no-op {noop:.0f} ({detail(noop_by)}); fleet turn {turn:.0f} ({detail(turn_by)})"
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = _arguments(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    extra = {"SOULFLEET_WORKER_CONCURRENCY": str(args.concurrency)} if args.concurrency else {}
    if args.baton == "off":
        extra["SOULFLEET_TURN_BATON"] = "0"
    if args.pool:
        extra["SOULFLEET_WORKER_POOL"] = args.pool
    configured = os.environ.get("REDIS_URL", "").strip() or None
    source = "REDIS_URL" if configured and reachable(configured) else "own redis-server"
    scratch = Path(tempfile.mkdtemp(prefix="sfbench-"))
    try:
        with live_redis(configured, scratch / "redis") as url:
            run = _Run(url, f"sfbench:{uuid.uuid4().hex[:10]}:", scratch, extra)
            settings = Settings.from_env(run.env("setup", scratch / "no-personas"))
            try:
                run.logs.mkdir(parents=True, exist_ok=True)
                trips = _trips(run)
                repeats = [_repeat(run, args, settings, n) for n in range(args.repeat)]
            finally:
                leftover = _clean(url, run.prefix)
                if leftover:
                    _say(f"WARNING: {leftover} keys under {run.prefix!r} survived the clean-up")
    finally:
        if args.keep:
            _say(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    setup = (
        f"bench_fleet: Redis {source}, Celery {celery.__version__}, Python "
        f"{sys.version.split()[0]}, {os.cpu_count()} cores; pool {settings.worker_pool}, "
        f"concurrency {settings.worker_concurrency}, baton {args.baton}, prefetch 1, acks_late, "
        f"turn gate {settings.max_concurrent_model_calls}; {args.turns} messages queued before "
        f"each worker starts; {args.repeat} repeats; measured turns: "
        + ("each persona's second (--warm-lanes)" if args.warm_lanes else "each persona's first")
    )
    print(_table(repeats, setup))
    print(trips)


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        print(f"bench_fleet: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)

"""Benchmark the fleet end to end against bare Celery, and PRINT one side-by-side table.

Run:  .venv/bin/python -m tests.bench.bench_fleet [--tasks N] [--turns N] [--slow-turns N]
      [--personas N] [--latency S] [--concurrency N] [--seconds S] [--keep]

Three figures from one run, each on a fresh real worker process with the same configuration
(:func:`workers.app.make_app`; pool and concurrency from :class:`Settings`, threads x 32 by
default) and each with its own throwaway key and queue prefix:

1. bare Celery: ``celery -A tests.bench.noop_app worker`` draining N no-op tasks (one Redis
   INCR each, which is how completions are counted) — the ceiling Celery itself sets. The queue
   is filled before the worker starts and the clock runs from the first executed task to the
   last: published live, the figure would measure this process's publishing, not the worker;
2. fleet turns with the scripted model answering at once: ``celery -A workers worker`` and
   personas whose ``persona.toml`` says ``model = "scripted:rules.toml"``;
3. fleet turns against a real local HTTP server speaking the OpenAI protocol that answers after
   ``--latency`` seconds (:class:`~tests.support.providers.FakeProvider`), at the default turn
   gate: the figure should approach min(concurrency, gate) / latency.

A turn is measured end to end: ``Fleet.post`` (lane script + Celery publish), ``start.lua``, soul
composition, the loop, fsynced transcript writes, ``finish.lua``. Each persona has at most one
item outstanding: its next item is posted when its current turn is seen starting (``turn.start``
in the worker's JSON log), so the finish script queues exactly one follow-up per item and the
worker never starves, while no turn ever coalesces two items (the count would be off). Rates are
N over (last ``turn.end`` timestamp minus the first post); "p50 ms" is the median turn duration
the worker logged; "cpu ms" is the worker process's CPU per task or turn (``/proc``), which
shows how close one thread-pool process is to its one-core (GIL) ceiling. The benchmark process
runs on the same cores, so its own CPU per turn is printed too.

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
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
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
from workers.publisher import CeleryPublisher
from workers.settings import Settings

__all__ = ["BenchError", "Result", "bench_noop", "bench_turns", "main"]

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
        """User + system CPU the worker process has used so far (Linux ``/proc``; else None)."""
        try:
            stat = Path(f"/proc/{self.popen.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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


def bench_noop(env: Mapping[str, str], logs: Path, *, tasks: int, seconds: float) -> Result:
    """Fill the queue with ``tasks`` no-op tasks, start a no-op worker, time how fast it drains.

    The queue is filled first because this process publishes slower than the worker runs no-ops
    on two cores: published concurrently, the figure would measure the publisher. The clock runs
    from the first executed task to the last, so start-up is not counted either.
    """
    settings = Settings.from_env(env)
    app = make_noop_app(settings)
    client = redis.Redis.from_url(settings.redis_url)
    key = done_key(settings)
    try:
        client.delete(key)
        began = time.perf_counter()
        with app.producer_or_acquire() as producer:
            for _ in range(tasks):
                app.send_task(NOOP_TASK, producer=producer, ignore_result=True)
        published = tasks / (time.perf_counter() - began)
        with _worker("noop", "tests.bench.noop_app", env, logs, wait=False) as worker:
            deadline = time.monotonic() + 60 + seconds  # start-up, then the run
            first: tuple[float, int, float | None] | None = None
            while True:
                done = int(client.get(key) or 0)
                now = time.perf_counter()
                if done and first is None:
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
        raise BenchError(f"all {tasks} no-op tasks ran between two polls: raise --tasks")
    return Result(
        "bare Celery no-op task",
        tasks,
        (tasks - first[1]) / (now - first[0]),
        settings.worker_pool,
        settings.worker_concurrency,
        cpu_ms=_per_op(first[2], cpu_end, tasks - first[1]),
        notes=(
            f"no-op: queue pre-filled (publishing alone: {published:,.0f} tasks/s), "
            "timed from the first executed task to the last",
        ),
    )


def _write_personas(root: Path, count: int, *, scripted: bool) -> list[str]:
    names = [f"p{i:04d}" for i in range(count)]
    for name in names:
        home = root / name
        home.mkdir(parents=True)
        (home / "SOUL.md").write_text(f"You are {name}.\n", encoding="utf-8")
        if scripted:
            (home / "rules.toml").write_text('[[rules]]\ntext = "ok"\n', encoding="utf-8")
            (home / "persona.toml").write_text('model = "scripted:rules.toml"\n', encoding="utf-8")
    return names


def _drive(
    fleet: Fleet, worker: _Worker, plan: dict[str, int], deadline: float
) -> tuple[float, list[dict[str, Any]]]:
    """Post each persona's items one at a time (the next when its turn starts); the turn ends."""
    remaining = dict(plan)
    total = sum(plan.values())
    began = time.time()
    for name in plan:
        fleet.post(name, "bench", sender="bench", channel="bench", wake=True)
        remaining[name] -= 1
    ends: list[dict[str, Any]] = []
    while len(ends) < total:
        fresh = worker.events()
        for event in fresh:
            name = str(event.get("lane", ""))
            if event.get("event") == "turn.start" and remaining.get(name, 0) > 0:
                fleet.post(name, "bench", sender="bench", channel="bench", wake=True)
                remaining[name] -= 1
            elif event.get("event") == "turn.end":
                if event.get("status") != "done" or event.get("items") != 1:
                    raise worker.error(f"turn did not end as benchmarked: {event}")
                ends.append(event)
        if not fresh:
            worker.check(deadline, f"{total} turns ({len(ends)} done)")
            time.sleep(_POLL)
    return began, ends


def bench_turns(
    label: str,
    worker_name: str,
    env: Mapping[str, str],
    logs: Path,
    names: Sequence[str],
    *,
    turns: int,
    seconds: float,
) -> Result:
    """``turns`` fleet turns spread over ``names`` on a fresh ``celery -A workers`` worker."""
    settings = Settings.from_env(env)
    personas = list(names)[: max(1, min(len(names), turns))]
    plan = {
        name: turns // len(personas) + (1 if i < turns % len(personas) else 0)
        for i, name in enumerate(personas)
    }
    publisher = CeleryPublisher(settings)
    fleet = Fleet(settings, publisher=publisher)
    try:
        with _worker(worker_name, "workers", env, logs) as worker:
            cpu_start, own_start = worker.cpu_seconds(), time.process_time()
            began, ends = _drive(fleet, worker, plan, time.monotonic() + seconds)
            cpu_end, own = worker.cpu_seconds(), time.process_time() - own_start
    finally:
        fleet.client.close()
        publisher.app.close()
    elapsed = max(float(e["at"]) for e in ends) - began
    p50 = statistics.median(float(e["seconds"]) for e in ends) * 1000
    return Result(
        label,
        turns,
        turns / elapsed,
        settings.worker_pool,
        settings.worker_concurrency,
        p50_ms=p50,
        cpu_ms=_per_op(cpu_start, cpu_end, turns),
        notes=(
            f"{label}: this process (posting, reading the worker log, any HTTP model) used "
            f"{own * 1000 / turns:,.2f} ms CPU per turn on the same cores",
        ),
    )


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


def _table(results: Sequence[Result], setup: str) -> str:
    header = (
        f"{'':<34} {'per s':>8} {'ms/op':>7} {'p50 ms':>8} {'cpu ms':>7} {'N':>6} "
        f"{'pool':>7} {'conc':>4}"
    )
    lines = [setup, header, "-" * len(header)]
    for r in results:
        p50 = "-" if r.p50_ms is None else f"{r.p50_ms:,.1f}"
        cpu = "-" if r.cpu_ms is None else f"{r.cpu_ms:,.2f}"
        lines.append(
            f"{r.label:<34} {r.rate:>8,.1f} {1000 / r.rate:>7,.2f} {p50:>8} {cpu:>7} "
            f"{r.count:>6} {r.pool:>7} {r.concurrency:>4}"
        )
    lines.append(
        "per s: turns completed per second from the first post to the last turn.end (no-op: see "
        "below); ms/op: 1000 / per s; p50 ms: median turn duration in the worker; cpu ms: "
        "worker process CPU (user+sys) per task or turn"
    )
    lines.extend(f"  {note}" for r in results for note in r.notes)
    return "\n".join(lines)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.bench_fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--tasks", type=int, default=5000, help="no-op tasks (default 5000)")
    add("--turns", type=int, default=1000, help="fleet turns at 0 ms (default 1000)")
    add("--slow-turns", type=int, default=None, help="turns at --latency (default 6 x concurrency)")
    add("--personas", type=int, default=200, help="personas per fleet phase (default 200)")
    add("--latency", type=float, default=2.0, help="HTTP model latency in seconds (default 2)")
    add("--concurrency", type=int, default=None, help="SOULFLEET_WORKER_CONCURRENCY (default 32)")
    add("--seconds", type=float, default=90.0, help="give up on a phase after this (default 90)")
    add("--keep", action="store_true", help="keep the scratch directory (worker logs, personas)")
    args = parser.parse_args(argv)
    for name in ("tasks", "turns", "personas", "slow_turns", "concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.latency < 0:
        parser.error("--latency must be >= 0")
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


def _phases(run: _Run, args: argparse.Namespace, settings: Settings) -> list[Result]:
    run.logs.mkdir(parents=True, exist_ok=True)
    _say(f"bare Celery, {args.tasks} no-op tasks ...")
    noop_env = run.env("noop", run.scratch / "no-personas")
    results = [bench_noop(noop_env, run.logs, tasks=args.tasks, seconds=args.seconds)]

    root = run.scratch / "scripted"
    names = _write_personas(root, args.personas, scripted=True)
    _say(f"fleet, {args.turns} turns, scripted model 0 ms ...")
    results.append(
        bench_turns("fleet turn, scripted model 0 ms", "fast", run.env("fast", root), run.logs,
                    names, turns=args.turns, seconds=args.seconds)
    )  # fmt: skip

    root = run.scratch / "http"
    names = _write_personas(root, args.personas, scripted=False)
    turns = args.slow_turns or 6 * settings.worker_concurrency
    _say(f"fleet, {turns} turns, HTTP model {args.latency:g} s ...")
    with FakeProvider("openai", delay=args.latency, text="ok") as provider:
        env = run.env(
            "slow", root, {"SOULFLEET_MODEL": "openai:fake", "OPENAI_BASE_URL": provider.base_url}
        )
        row = bench_turns(f"fleet turn, HTTP model {args.latency:g} s", "slow", env, run.logs,
                          names, turns=turns, seconds=args.seconds)  # fmt: skip
        gate = Settings.from_env(env).max_concurrent_model_calls
        slots = min(settings.worker_concurrency, gate) if gate else settings.worker_concurrency
        ideal = f"{slots / args.latency:,.1f}" if args.latency else "-"
        served = (
            f"HTTP model: {len(provider.requests)} requests, at most {provider.max_in_flight} at "
            f"once; ideal {ideal} turns/s = min(concurrency, gate {gate}) / latency"
        )
        results.append(replace(row, notes=(*row.notes, served)))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    args = _arguments(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    extra = {"SOULFLEET_WORKER_CONCURRENCY": str(args.concurrency)} if args.concurrency else {}
    configured = os.environ.get("REDIS_URL", "").strip() or None
    source = "REDIS_URL" if configured and reachable(configured) else "own redis-server"
    scratch = Path(tempfile.mkdtemp(prefix="sfbench-"))
    try:
        with live_redis(configured, scratch / "redis") as url:
            run = _Run(url, f"sfbench:{uuid.uuid4().hex[:10]}:", scratch, extra)
            settings = Settings.from_env(run.env("setup", scratch / "no-personas"))
            try:
                results = _phases(run, args, settings)
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
        f"concurrency {settings.worker_concurrency}, prefetch 1, acks_late, turn gate "
        f"{settings.max_concurrent_model_calls}; {args.personas} personas"
    )
    print(_table(results, setup))


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        print(f"bench_fleet: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)

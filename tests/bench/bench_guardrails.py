"""Production faults against real processes, with the figures PRINTED (issue 10, must-shows:
files that block, Redis guardrails, side effects once; the outage and lost messages are
:mod:`tests.bench.bench_faults`).

Run:  .venv/bin/python -m tests.bench.bench_guardrails [files|policy|reply|memory ...]

Uses ``REDIS_URL`` if it answers, else starts its own redis-server; every key lives under a
throwaway prefix. Real ``celery -A workers worker`` and ``celery -A workers beat`` processes
(the same commands an operator runs) and the real ``soulfleet status`` CLI.

* ``files``: 100 healthy personas on 1 s heartbeats beside one persona each with a FIFO
  persona.toml, a FIFO HEARTBEAT.md, a HEARTBEAT.md symlinked to /dev/zero and a 400-digit
  duration. Prints ticks per healthy persona, beat's sweep intervals, what ``soulfleet status``
  says about the bad ones, and how long the worker took to end the turns posted to them.
* ``policy``: Redis with ``maxmemory-policy allkeys-lru``: worker and beat refuse to start;
  prints their exit codes and messages.
* ``reply``: a 20 MB model reply (a real HTTP provider) committed by a real worker while a
  thread PINGs Redis in a loop; prints the latency percentiles and the stored sizes.
* ``memory``: a turn that adds a memory entry and then dies (SIGKILL) three times before it
  finally commits; prints how often the entry is in MEMORY.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools

from tests.support.fleet import (
    FleetProcess,
    fleet_env,
    post_past_the_door,
    read_events,
    start_beat,
    start_worker,
    wait_until,
)
from tests.support.memory import remember_then_answer
from tests.support.providers import FakeProvider
from tests.support.redis import live_redis
from workers.local.redis_server import RedisServer
from workers.persona.errors import PersonaError
from workers.persona.inbox import InboxItem
from workers.publisher import connect
from workers.settings import Settings

__all__ = ["main"]

HEALTHY = 100
RUN_SECONDS = 30.0


@contextmanager
def _fleet_dirs(
    url: str, extra: dict[str, str] | None = None
) -> Iterator[tuple[Path, dict[str, str]]]:
    prefix = f"bench-faults-{uuid.uuid4().hex[:8]}:"
    with tempfile.TemporaryDirectory(prefix="soulfleet-faults-") as scratch:
        root = Path(scratch) / "personas"
        root.mkdir()
        env = fleet_env(redis_url=url, key_prefix=prefix, personas=root, extra=extra)
        try:
            yield Path(scratch), env
        finally:
            client = redis.Redis.from_url(url)
            for batch in _chunks(client.scan_iter(match=f"{prefix}*", count=5000)):
                client.delete(*batch)
            client.close()


def _chunks(keys: Iterator[Any], size: int = 5000) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for key in keys:
        batch.append(key)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _stop(*processes: FleetProcess) -> None:
    for process in processes:
        process.stop()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- files ------------------------------------------------------------------------------------
def _bad_personas(root: Path) -> dict[str, str]:
    def home(name: str) -> Path:
        path = root / name
        path.mkdir()
        (path / "SOUL.md").write_text(f"You are {name}.\n")
        return path

    os.mkfifo(home("fifo-toml") / "persona.toml")
    fifo_heartbeat = home("fifo-heartbeat")
    (fifo_heartbeat / "persona.toml").write_text('[heartbeat]\nevery = "1s"\n')
    os.mkfifo(fifo_heartbeat / "HEARTBEAT.md")
    zero = home("zero")
    (zero / "persona.toml").write_text('[heartbeat]\nevery = "1s"\n')
    (zero / "HEARTBEAT.md").symlink_to("/dev/zero")
    (home("huge-every") / "persona.toml").write_text('[heartbeat]\nevery = "1' + "0" * 400 + 'd"\n')
    return {
        "fifo-toml": "FIFO persona.toml",
        "fifo-heartbeat": "FIFO HEARTBEAT.md",
        "zero": "HEARTBEAT.md -> /dev/zero",
        "huge-every": "every = 1 + 400 zeros + d",
    }


def bench_files(url: str) -> None:
    for with_bad in (False, True):
        what = "+ 4 bad ones" if with_bad else "alone (control run)"
        print(f"== files: {HEALTHY} healthy personas on 1 s heartbeats {what}, {RUN_SECONDS:.0f} s")
        _files_run(url, with_bad=with_bad)


def _files_run(url: str, *, with_bad: bool) -> None:
    extra = {"SOULFLEET_SYNC_INTERVAL": "2", "SOULFLEET_WORKER_CONCURRENCY": "16"}
    with _fleet_dirs(url, extra) as (scratch, env):
        root = Path(env["SOULFLEET_PERSONAS"])
        for n in range(HEALTHY):
            path = root / f"p{n:03d}"
            path.mkdir()
            (path / "persona.toml").write_text('[heartbeat]\nevery = "1s"\n')
            (path / "HEARTBEAT.md").write_text("Nothing is due; reply HEARTBEAT_OK.\n")
        bad = _bad_personas(root) if with_bad else {}
        logs = scratch / "logs"
        worker = start_worker(env, logs, concurrency=16)
        started = time.monotonic()
        beat = start_beat(env, logs)
        print(f"beat's first sweep {time.monotonic() - started:.2f}s after start")
        fleet = connect(Settings.from_env(env))
        posted = time.time()
        refused = 0
        for name in bad:  # a worker must end these turns, not hang on their files
            try:
                fleet.post(name, "hello", sender="bench")
            except PersonaError:
                # Refused at the door (Fleet.post checks the files); a file can still turn
                # bad between a post and its turn, so queue one behind the door's back.
                refused += 1
                post_past_the_door(fleet, name, "hello")
        print(f"posts to the bad personas refused at the door (Fleet.post): {refused}/{len(bad)}")
        time.sleep(RUN_SECONDS)
        status = subprocess.run(
            [sys.executable, "-c", "from workers.cli import main; main()", "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        lanes = {name: fleet.lanes.status(name) for name in bad}
        _stop(beat, worker)
        sweeps = read_events(beat.log_path, "sweep.done")
        ticks: Counter[str] = Counter()
        for event in read_events(beat.log_path):
            if event.get("event") in ("tick.emitted", "tick.coalesced"):
                ticks[str(event.get("lane"))] += 1
        healthy = [ticks[f"p{n:03d}"] for n in range(HEALTHY)]
        window = (float(sweeps[-1]["ts"]) - float(sweeps[0]["ts"])) if len(sweeps) > 1 else 0.0
        print(
            f"healthy personas ticked: {sum(1 for t in healthy if t > 0)}/{HEALTHY}; ticks each "
            f"over {window:.1f}s: min {min(healthy)} median {statistics.median(healthy):.0f} "
            f"max {max(healthy)}"
        )
        gaps = [float(b["ts"]) - float(a["ts"]) for a, b in itertools.pairwise(sweeps)]
        print(
            f"sweeps: {len(sweeps)}; interval p50 {_percentile(gaps, 0.5):.3f}s "
            f"p99 {_percentile(gaps, 0.99):.3f}s max {max(gaps, default=0):.3f}s "
            f"(SOULFLEET_SWEEP_INTERVAL 1s); longest pass "
            f"{max((float(s['seconds']) for s in sweeps), default=0):.3f}s"
        )
        failures = read_events(beat.log_path, "beat.task_failed")
        print(f"beat.task_failed events: {len(failures)}")
        invalid = json.loads(status.stdout).get("invalid", {}) if status.returncode == 0 else {}
        print(f"soulfleet status --json (exit {status.returncode}) lists {len(invalid)} invalid:")
        for name, what in bad.items():
            print(f"  {name:<15} ({what}): {invalid.get(name, 'NOT LISTED')}")
        ends = read_events(worker.log_path, "turn.end")
        for name in bad:
            mine = [e for e in ends if e.get("lane") == name]
            last = max((float(e["ts"]) for e in mine), default=float("nan"))
            state = lanes[name].get("state")
            print(
                f"  worker on {name:<15}: {len(mine)} turn(s) ended, last "
                f"{last - posted:.2f}s after the post; lane now {state}"
            )
        running = list(read_events(worker.log_path, "turn.start"))
        ended_ids = {(e.get("lane"), e.get("fence")) for e in ends}
        open_turns = [e for e in running if (e.get("lane"), e.get("fence")) not in ended_ids]
        print(f"turns started but never ended when the worker stopped: {len(open_turns)}")


# -- reply ------------------------------------------------------------------------------------
REPLY_BYTES = 20 * 1024 * 1024


_PINGER = """
import json, sys, threading, time, redis
client = redis.Redis.from_url(sys.argv[1])
samples = []
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    began = time.perf_counter()
    client.ping()
    samples.append((time.perf_counter() - began) * 1000)
    time.sleep(0.001)
print(json.dumps(samples))
"""


class Pinger:
    """PINGs Redis in a loop from ANOTHER PROCESS (no shared GIL with the bench), like
    ``redis-cli --latency``, and reads Redis's own SLOWLOG: how long commands took inside
    the server, which is what a stall is (the client side also shows machine load)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client = redis.Redis.from_url(url, decode_responses=True)
        self._process: subprocess.Popen[str] | None = None
        self.samples: list[float] = []
        self.slowest_us = 0
        self.slow_commands: list[str] = []

    def __enter__(self) -> Pinger:
        self._client.config_set("slowlog-log-slower-than", 1000)  # every command over 1 ms
        self._client.config_set("slowlog-max-len", 10000)
        self._client.slowlog_reset()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _PINGER, self._url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)  # let the pinger start (a Python start-up under load takes a while)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._process is not None
        out, _err = self._process.communicate("", timeout=60)
        self.samples = json.loads(out or "[]")
        entries = self._client.slowlog_get(10000)
        self.slowest_us = max((int(e["duration"]) for e in entries), default=0)
        self.slow_commands = [
            f"{e['duration'] / 1000:.1f} ms {str(e['command'])[:60]}"
            for e in sorted(entries, key=lambda e: -int(e["duration"]))[:3]
        ]
        self._client.config_set("slowlog-log-slower-than", 10000)
        self._client.close()

    def summary(self) -> str:
        xs = self.samples
        over = sum(1 for x in xs if x >= 10.0)
        return (
            f"client PINGs from another process: {len(xs)}, p50 {_percentile(xs, 0.5):.2f} ms, "
            f"p99 {_percentile(xs, 0.99):.2f} ms, max {max(xs, default=0):.2f} ms, {over} at or "
            f"over 10 ms; inside Redis (SLOWLOG) the slowest command took "
            f"{self.slowest_us / 1000:.2f} ms {self.slow_commands}"
        )


def bench_reply(url: str) -> None:
    for size in (2, REPLY_BYTES):
        what = "control run, a 2-byte reply" if size == 2 else f"a {size // 2**20} MB model reply"
        print(f"== reply: {what} through a real worker (run + heartbeat)")
        _reply_run(url, size)
    _finish_cost(url)


def _finish_cost(url: str, rounds: int = 200) -> None:
    """finish.lua committing a reply at the default cap, in isolation: the median is what a
    commit costs Redis; the tail is this machine's scheduling noise."""
    settings = Settings()
    with _fleet_dirs(url) as (_scratch, env):
        fleet = connect(Settings.from_env(env))
        lanes = fleet.lanes
        text = "x" * settings.reply_max_bytes
        client = redis.Redis.from_url(url, decode_responses=True)
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        for n in range(rounds):
            item = InboxItem.create("q", "bench", "api", reply=True, trusted=True)
            turn = lanes.post("ava", item, wake=True).turn_id
            assert turn is not None
            started = lanes.start("ava", turn, "bench")
            lanes.finish(
                "ava", started.fence, status="done", text=text, reply_ids=[item.id],
                beat={"persona": "ava", "text": text},
            )  # fmt: skip
            client.delete(fleet.keys.reply(item.id))
            del n
        entries = client.slowlog_get(100_000)
        client.config_set("slowlog-log-slower-than", 10000)
        client.close()
        finishes = [
            int(e["duration"]) / 1000
            for e in entries
            if f"EVALSHA {lanes.scripts.finish.sha} " in str(e["command"])
        ]
        print(
            f"finish.lua with a {settings.reply_max_bytes}-byte reply and beat, {len(finishes)} "
            f"commits in isolation: median {statistics.median(finishes):.3f} ms, p99 "
            f"{_percentile(finishes, 0.99):.3f} ms, max {max(finishes):.3f} ms inside Redis"
        )


def _reply_run(url: str, size: int) -> None:
    with FakeProvider("openai", text="x" * size) as provider:
        extra = {
            "OPENAI_BASE_URL": provider.base_url,
            "OPENAI_API_KEY": "bench-key",
            "SOULFLEET_MODEL": "openai:fake",
        }
        with _fleet_dirs(url, extra) as (scratch, env):
            root = Path(env["SOULFLEET_PERSONAS"])
            (root / "ava").mkdir()
            (root / "ava" / "SOUL.md").write_text("You are ava.\n")
            (root / "ava" / "HEARTBEAT.md").write_text("Say a lot.\n")
            settings = Settings.from_env(env)
            worker = start_worker(env, scratch / "logs", concurrency=2)
            fleet = connect(settings)
            try:
                with Pinger(url) as pinger:
                    began = time.monotonic()
                    answer = fleet.run("ava", "tell me everything", timeout=300)
                    ran = time.monotonic() - began
                    fleet.tick("ava")
                    wait_until(lambda: fleet.beats(1), timeout=300, what="the heartbeat's beat")
                    time.sleep(0.5)
                print(f"run answered in {ran:.2f}s; Redis latency meanwhile: {pinger.summary()}")
            finally:
                _stop(worker)
            beat = fleet.beats(1)[0]
            transcripts = sorted((root / "ava" / "transcripts" / "ava").glob("*.jsonl"))
            print(
                f"model sent {size} bytes; stored: run reply "
                f"{len(answer.text.encode())} bytes (SOULFLEET_REPLY_MAX_BYTES "
                f"{settings.reply_max_bytes}), beat {len(beat.text.encode())} bytes "
                f"(SOULFLEET_BEAT_MAX_BYTES {settings.beat_max_bytes}), last_text "
                f"{len(str(fleet.lanes.status('ava').get('last_text', '')))} chars, transcripts "
                f"{[t.stat().st_size for t in transcripts]} bytes"
            )
            print(f"reply ends with: {answer.text[-80:]!r}")
            capped = read_events(worker.log_path, "turn.reply_capped")
            print(f"worker logged turn.reply_capped {len(capped)} time(s): {capped[:1]}")


# -- policy -----------------------------------------------------------------------------------
def bench_policy(_url: str) -> None:
    print("== policy: worker and beat against a Redis with maxmemory-policy allkeys-lru")
    with (
        tempfile.TemporaryDirectory(prefix="soulfleet-faults-policy-") as scratch,
        RedisServer(Path(scratch) / "redis") as server,
    ):
        client = redis.Redis.from_url(server.url, decode_responses=True)
        client.config_set("maxmemory-policy", "allkeys-lru")
        root = Path(scratch) / "personas"
        (root / "ava").mkdir(parents=True)
        (root / "ava" / "persona.toml").write_text('[heartbeat]\nevery = "1s"\n')
        env = fleet_env(redis_url=server.url, key_prefix="policy:", personas=root)
        celery = [sys.executable, "-m", "celery", "-A", "workers"]
        for name, argv in (
            ("worker", [*celery, "worker", "-P", "threads", "-c", "2", "--without-mingle"]),
            ("beat", [*celery, "beat"]),
        ):
            began = time.monotonic()
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=120, check=False
            )
            said = [line for line in done.stderr.splitlines() if "refusing" in line]
            print(
                f"{name}: exit {done.returncode} after {time.monotonic() - began:.1f}s: "
                f"{said[0] if said else done.stderr[-300:]}"
            )
        print(f"keys written to that Redis meanwhile: {client.dbsize()}")
        client.close()


# -- memory -----------------------------------------------------------------------------------


def bench_memory(url: str) -> None:
    print("== memory: a turn adds a memory entry, then its worker is SIGKILLed; 3 times")
    extra = {"SOULFLEET_LEASE_TTL": "2", "SOULFLEET_REAP_INTERVAL": "1"}
    with _fleet_dirs(url, extra) as (scratch, env):
        home = Path(env["SOULFLEET_PERSONAS"]) / "ava"
        home.mkdir()
        (home / "rules.toml").write_text(remember_then_answer(120))
        (home / "persona.toml").write_text('model = "scripted:rules.toml"\n')
        logs = scratch / "logs"
        beat = start_beat(env, logs)
        fleet = connect(Settings.from_env(env))
        began = time.monotonic()
        try:
            for attempt in range(3):
                worker = start_worker(env, logs, name=f"w{attempt}")
                if attempt == 0:
                    fleet.post("ava", "Please remember: the sky is green.", sender="bench")

                def wrote(w: FleetProcess = worker) -> bool:
                    return bool(w.events("memory.write") or w.events("memory.write_replayed"))

                wait_until(wrote, timeout=120, what="the memory write")
                worker.kill()
                count = (home / "MEMORY.md").read_text().count("The sky is green.")
                print(
                    f"attempt {attempt + 1}: wrote, then SIGKILLed; entries in MEMORY.md: {count}"
                )
            (home / "rules.toml").write_text(remember_then_answer(0))
            final = start_worker(env, logs, name="w3")
            wait_until(
                lambda: [e for e in final.events("turn.end") if e.get("status") == "done"],
                timeout=120,
                what="the commit",
            )
            final.stop()
        finally:
            beat.stop()
        count = (home / "MEMORY.md").read_text().count("The sky is green.")
        replays = sum(len(read_events(p, "memory.write_replayed")) for p in logs.glob("*.log"))
        print(
            f"attempt 4 committed after {time.monotonic() - began:.1f}s; the entry is in "
            f"MEMORY.md {count} time(s); retries answered from the ledger: {replays}; lane "
            f"{fleet.lanes.status('ava')['last_status']}"
        )


COMMANDS: dict[str, Callable[[str], None]] = {
    "files": bench_files,
    "policy": bench_policy,
    "reply": bench_reply,
    "memory": bench_memory,
}


def main(argv: list[str] | None = None) -> None:
    chosen = (argv if argv is not None else sys.argv[1:]) or list(COMMANDS)
    with (
        tempfile.TemporaryDirectory(prefix="soulfleet-faults-redis-") as scratch,
        live_redis(os.environ.get("REDIS_URL"), Path(scratch)) as url,
    ):
        for name in chosen:
            COMMANDS[name](url)


if __name__ == "__main__":
    main()

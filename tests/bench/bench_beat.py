"""Benchmark beat's sweep and registry sync and PRINT the figures (no assertions: see tests/beat/).

Run:  .venv/bin/python -m tests.bench.bench_beat   (or: python tests/bench/bench_beat.py)

Uses ``REDIS_URL`` if it answers, else starts its own redis-server (no persistence); every key
lives under a throwaway prefix that is deleted afterwards. Turn messages go to a no-op
publisher, so the figures are Redis + sweep cost, not broker cost. Per-tick INFO log lines are
filtered out except in the one run that measures them.

For 1,000 / 10,000 / 100,000 registered lanes:

* sweep time with nothing due, with 1% due and with all due (every due lane is claimed,
  re-scored, checked for skips — HEARTBEAT.md stat, active hours — and ticked);
* ticks per second through the tick path (``Fleet.tick_lanes``) on its own;

then the registry sync of 1,000 / 10,000 persona directories (first sync, and an unchanged
re-sync), the cost of INFO JSON log lines per tick, and ``next_fire`` for a cron expression.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import redis
import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import beat.sweep
from beat.cron import next_fire
from beat.schedule import ScheduleSpec, to_ms
from beat.sweep import Sweeper
from beat.sync import RegistrySync
from tests.support.redis import live_redis
from workers.fleet import Fleet
from workers.logs import configure_logging
from workers.settings import Settings

__all__ = ["NoopPublisher", "main"]

SIZES = (1_000, 10_000, 100_000)
HOMES = 100  # lanes share this many real persona directories (stat + cache work stays real)


class NoopPublisher:
    """Drops turn messages: the benchmark measures Redis and the sweep, not the broker."""

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        return None

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        return None


def _quiet() -> None:
    """Production logging (cached, level-filtered loggers), with INFO lines filtered out."""
    configure_logging("console", "WARNING", force=True)


def _fleet(url: str, prefix: str, root: Path) -> Fleet:
    settings = Settings.from_env(
        {"REDIS_URL": url, "SOULFLEET_KEY_PREFIX": prefix, "SOULFLEET_PERSONAS": str(root)}
    )
    return Fleet.from_settings(settings, publisher=NoopPublisher())


def _clean(client: redis.Redis, prefix: str) -> None:
    for batch in _batched(client.scan_iter(match=f"{prefix}*", count=5000), 5000):
        client.delete(*batch)


def _batched(items: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _register(fleet: Fleet, specs: Sequence[ScheduleSpec], due: float) -> None:
    for start in range(0, len(specs), 5000):
        chunk = specs[start : start + 5000]
        pipe = fleet.client.pipeline(transaction=False)
        pipe.hset(fleet.keys.schedule_spec, mapping={s.member: s.to_json() for s in chunk})
        pipe.zadd(fleet.keys.schedule, {s.member: to_ms(due) for s in chunk})
        pipe.execute()


def _make_due(fleet: Fleet, members: Sequence[str]) -> None:
    for start in range(0, len(members), 5000):
        fleet.client.zadd(fleet.keys.schedule, dict.fromkeys(members[start : start + 5000], 0))


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _homes(root: Path) -> list[Path]:
    homes = []
    for i in range(HOMES):
        home = root / f"home{i:03d}"
        home.mkdir(parents=True, exist_ok=True)
        (home / "HEARTBEAT.md").write_text("Check the inbox.\n", encoding="utf-8")
        homes.append(home)
    return homes


def bench_sweep(
    url: str, root: Path, size: int, *, spend: bool = False
) -> tuple[float, float, float, float, float]:
    """Sweep seconds with nothing due, 1% due, all due (first pass: every lane idle and its
    spec not yet cached; again: steady state, every tick coalesces), and tick path ticks/s.
    ``spend``: every lane has a daily budget and idle_after/idle_every, so each due lane also
    costs the spend reads (budget tokens, last post) in the batch's extra round trip."""
    prefix = f"sfbench:{uuid.uuid4().hex[:8]}:"
    fleet = _fleet(url, prefix, root)
    homes = _homes(root / "homes")
    specs = [
        ScheduleSpec(
            lane=f"lane{i:06d}",
            kind="heartbeat",
            persona=f"lane{i:06d}",
            home=str(homes[i % HOMES]),
            every=3600.0,
            jitter=0.1,
            budget=200_000 if spend else None,
            idle_after=259_200.0 if spend else None,
            idle_every=21_600.0 if spend else None,
        )
        for i in range(size)
    ]
    members = [spec.member for spec in specs]
    try:
        _register(fleet, specs, due=time.time() + 86_400)
        sweeper = Sweeper(fleet)
        sweeper.run()  # warm: script load, connection
        idle = min(_timed(sweeper.run) for _ in range(5))
        _make_due(fleet, members[::100])
        one_percent = _timed(sweeper.run)
        _make_due(fleet, members)
        everything = _timed(sweeper.run)
        _make_due(fleet, members)
        again = _timed(sweeper.run)
        pairs = [(spec.lane, "heartbeat") for spec in specs]
        tick_seconds = _timed(lambda: fleet.tick_lanes(pairs))
        return idle, one_percent, everything, again, size / tick_seconds
    finally:
        _clean(fleet.client, prefix)
        fleet.client.close()


def bench_log_cost(url: str, root: Path, size: int = 10_000) -> float:
    """Extra seconds per tick when every tick writes an INFO JSON line (to /dev/null)."""
    prefix = f"sfbench:{uuid.uuid4().hex[:8]}:"
    fleet = _fleet(url, prefix, root)
    homes = _homes(root / "homes")
    specs = [
        ScheduleSpec(
            lane=f"log{i:06d}",
            kind="heartbeat",
            persona="x",
            home=str(homes[i % HOMES]),
            every=3600.0,
        )
        for i in range(size)
    ]
    members = [spec.member for spec in specs]
    saved = sys.stderr
    try:
        _register(fleet, specs, due=time.time() + 86_400)
        sweeper = Sweeper(fleet)
        _make_due(fleet, members)
        sweeper.run()  # warm the spec cache and queue every lane: both passes below coalesce
        _make_due(fleet, members)
        quiet = _timed(sweeper.run)
        sys.stderr = io.TextIOWrapper(open(os.devnull, "wb"))  # noqa: SIM115 - restored below
        configure_logging("json", "INFO", force=True)
        # The module's logger cached the WARNING filter on first use; give it a fresh one.
        beat.sweep._log = structlog.get_logger("soulfleet.beat")
        _make_due(fleet, members)
        loud = _timed(sweeper.run)
        return (loud - quiet) / size
    finally:
        sys.stderr = saved
        _quiet()
        beat.sweep._log = structlog.get_logger("soulfleet.beat")
        _clean(fleet.client, prefix)
        fleet.client.close()


def bench_sync(url: str, root: Path, size: int) -> tuple[float, float]:
    """(first sync, unchanged re-sync) seconds for ``size`` persona directories."""
    personas = root / f"personas{size}"
    for i in range(size):
        home = personas / f"p{i:06d}"
        home.mkdir(parents=True)
        (home / "persona.toml").write_text('[heartbeat]\nevery = "30m"\n', encoding="utf-8")
        (home / "HEARTBEAT.md").write_text("Check.\n", encoding="utf-8")
    prefix = f"sfbench:{uuid.uuid4().hex[:8]}:"
    fleet = _fleet(url, prefix, personas)
    sync = RegistrySync(
        client=fleet.client, keys=fleet.keys, registry=fleet.registry, settings=fleet.settings
    )
    try:
        first = _timed(sync.run)
        again = min(_timed(sync.run) for _ in range(3))
        return first, again
    finally:
        _clean(fleet.client, prefix)
        fleet.client.close()


def main() -> None:
    _quiet()
    configured = os.environ.get("REDIS_URL", "").strip() or None
    with (
        tempfile.TemporaryDirectory() as redis_dir,
        live_redis(configured, Path(redis_dir)) as url,
        tempfile.TemporaryDirectory() as scratch,
    ):
        where = "REDIS_URL" if url == configured else "own redis-server"
        root = Path(scratch)
        print(f"beat benchmark — Redis: {where}; turn messages: no-op publisher, so the figures")
        print("are Redis + sweep cost (claim, re-score, skip checks, tick scripts), no broker.")
        print(f"Lanes share {HOMES} real persona directories; batch 5000; per-tick logs off.")
        print("Sweep wall time; 'all due' twice: first pass (lanes idle, specs parsed) and again")
        print("(steady state: specs cached, ticks coalesce). Tick path: Fleet.tick_lanes alone.\n")
        print(
            f"{'lanes':>8} | {'none due':>9} | {'1% due':>9} | {'all due, first':>14} | "
            f"{'all due, again':>14} | {'tick path':>13}"
        )
        print("-" * 84)
        for size in SIZES:
            idle, some, everything, again, rate = bench_sweep(url, root, size)
            print(
                f"{size:>8,} | {idle * 1000:>6.2f} ms | {some * 1000:>6.1f} ms | "
                f"{everything * 1000:>11.0f} ms | {again * 1000:>11.0f} ms | "
                f"{rate:>8,.0f} t/s"
            )
        print("with a daily budget and idle_after/idle_every on every lane (spend reads):")
        for size in SIZES:
            idle, some, everything, again, rate = bench_sweep(url, root, size, spend=True)
            print(
                f"{size:>8,} | {idle * 1000:>6.2f} ms | {some * 1000:>6.1f} ms | "
                f"{everything * 1000:>11.0f} ms | {again * 1000:>11.0f} ms | "
                f"{rate:>8,.0f} t/s"
            )
        print()
        per_tick = bench_log_cost(url, root)
        print(
            f"INFO JSON log line per tick (10,000 due, to /dev/null): +{per_tick * 1e6:.0f} µs "
            "per tick"
        )
        for size in (1_000, 10_000):
            first, again = bench_sync(url, root, size)
            print(
                f"registry sync, {size:>6,} personas: first {first * 1000:>7.0f} ms, "
                f"unchanged {again * 1000:>6.1f} ms"
            )
        runs = 2000
        started = time.perf_counter()
        for i in range(runs):
            next_fire("0 3 * * *", 1_717_200_000.0 + i * 3600, "Europe/Berlin")
        cron = (time.perf_counter() - started) / runs
        print(f"cron next_fire('0 3 * * *', Europe/Berlin): {cron * 1e6:.1f} µs")


if __name__ == "__main__":
    main()

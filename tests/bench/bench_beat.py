"""Benchmark beat's sweep and registry sync and PRINT the figures (no assertions: see tests/beat/).

Run:  .venv/bin/python -m tests.bench.bench_beat   (or: python tests/bench/bench_beat.py)

Uses ``REDIS_URL`` if it answers, else starts its own redis-server (no persistence); every key
lives under a throwaway prefix that is deleted afterwards. Turn messages go to a no-op
publisher, so the figures are Redis + sweep cost, not broker cost. Per-tick INFO log lines are
filtered out except in the one run that measures them.

For 1,000 / 10,000 / 100,000 registered lanes:

* sweep time with nothing due, with 1% due and with all due (every due lane is claimed,
  re-scored, checked for skips — HEARTBEAT.md stat, active hours — and ticked), the all-due
  steady state beside the bare pipelined Redis floor of the same work;
* ticks per second through the tick path (``Fleet.tick_lanes``) on its own;

then 100,000 dream lanes falling due at once with their turns published to the real broker
(beside send_task one at a time on a 10,000 sample), the registry sync of 1,000 / 10,000
persona directories (first sync, and an unchanged
re-sync), the cost of INFO JSON log lines per tick, and ``next_fire`` for a cron expression.
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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
from workers.publisher import CeleryPublisher
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
        pipe.incr(fleet.keys.schedule_epoch)
        pipe.execute()


def _make_due(fleet: Fleet, members: Sequence[str]) -> None:
    for start in range(0, len(members), 5000):
        fleet.client.zadd(fleet.keys.schedule, dict.fromkeys(members[start : start + 5000], 0))


def _ms(values: Sequence[float]) -> str:
    return _spread([v * 1000 for v in values], ",.0f") + " ms"


def _spread(values: Sequence[float], fmt: str = ".2f") -> str:
    mid = statistics.median(values)
    return f"{mid:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


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


def bare_floor(fleet: Fleet, batch: int = 5000) -> float:
    """Seconds for the bare Redis work of an all-due sweep: per batch of ``batch`` due members,
    ZRANGEBYSCORE, then one pipelined round trip of a ZADD (all of them, to the future) and a
    HINCRBY per member on its lane hash. No script, no Python beyond redis-py."""
    client, keys = fleet.client, fleet.keys
    started = time.perf_counter()
    later = to_ms(time.time() + 86_400)
    while True:
        due: list[tuple[str, float]] = client.zrangebyscore(  # type: ignore[assignment]
            keys.schedule, "-inf", to_ms(time.time()), start=0, num=batch, withscores=True
        )
        if not due:
            break
        members = [str(member) for member, _ in due]
        pipe = client.pipeline(transaction=False)
        pipe.zadd(keys.schedule, dict.fromkeys(members, later), xx=True)
        for member in members:
            pipe.hincrby(keys.lane(member.split("|", 1)[0]), "ticks", 1)
        pipe.execute()
    return time.perf_counter() - started


@dataclass(frozen=True)
class SweepFigures:
    idle: float
    one_percent: float
    first: float
    again: list[float]
    floor: list[float]
    tick_rate: float


def bench_sweep(url: str, root: Path, size: int, repeat: int = 3) -> SweepFigures:
    """Sweep seconds with nothing due, 1% due, all due (first pass: every lane idle and its
    spec not yet known; again: steady state, every tick coalesces, each pass beside the bare
    floor on the same members), and tick path ticks/s."""
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
        again: list[float] = []
        floor: list[float] = []
        for _ in range(repeat):
            _make_due(fleet, members)
            again.append(_timed(sweeper.run))
            _make_due(fleet, members)
            floor.append(bare_floor(fleet))
        pairs = [(spec.lane, "heartbeat") for spec in specs]
        tick_seconds = _timed(lambda: fleet.tick_lanes(pairs))
        return SweepFigures(idle, one_percent, everything, again, floor, size / tick_seconds)
    finally:
        _clean(fleet.client, prefix)
        fleet.client.close()


def bench_publish(url: str, root: Path, size: int, sample: int) -> tuple[float, float, float]:
    """(sweep seconds, publishing seconds, bare send_task seconds PER MESSAGE) for ``size`` idle
    lanes falling due at once, their turns published for real (:class:`CeleryPublisher`: on a
    Redis broker, straight to the queue lists in Celery's format) to the broker; the anchor
    publishes ``sample`` turn messages with plain ``send_task``, one at a time, right after."""
    prefix = f"sfbench:{uuid.uuid4().hex[:8]}:"
    settings = Settings.from_env(
        {"REDIS_URL": url, "SOULFLEET_KEY_PREFIX": prefix, "SOULFLEET_QUEUE_PREFIX": prefix[:-1],
         "SOULFLEET_PERSONAS": str(root)}
    )  # fmt: skip
    publisher = _TimedPublisher(CeleryPublisher(settings))
    fleet = Fleet.from_settings(settings, publisher=publisher)
    homes = _homes(root / "homes")
    specs = [
        ScheduleSpec(lane=f"cron{i:06d}", kind="dream", persona=f"cron{i:06d}",
                     home=str(homes[i % HOMES]), cron="0 3 * * *")
        for i in range(size)
    ]  # fmt: skip
    try:
        _register(fleet, specs, due=time.time() + 86_400)
        _make_due(fleet, [spec.member for spec in specs])
        sweeper = Sweeper(fleet)
        seconds = _timed(sweeper.run)
        queued = fleet.client.llen(f"{prefix}broker:{prefix[:-1]}.dream")
        if queued != size:
            raise RuntimeError(f"{queued} turn messages queued for {size} lanes")
        return seconds, publisher.seconds, _bare_send_task(publisher.inner, sample) / sample
    finally:
        publisher.inner.close()
        _clean(fleet.client, prefix)
        fleet.client.close()


def _bare_send_task(publisher: CeleryPublisher, size: int) -> float:
    app = publisher.app
    started = time.perf_counter()
    for i in range(size):
        app.send_task("soulfleet.turn", args=[f"bare{i}", f"t{i}"], queue="bench.bare",
                      ignore_result=True)  # fmt: skip
    return time.perf_counter() - started


class _TimedPublisher:
    """A real publisher that adds up the time spent publishing."""

    def __init__(self, inner: CeleryPublisher) -> None:
        self.inner = inner
        self.seconds = 0.0

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        self.publish_many([(lane, turn_id, kind)])

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        started = time.perf_counter()
        self.inner.publish_many(turns)
        self.seconds += time.perf_counter() - started


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
            f"{'all due, again':>22} | {'bare floor':>22} | {'again/floor':>17} | {'tick path':>12}"
        )
        print("-" * 128)
        for size in SIZES:
            f = bench_sweep(url, root, size)
            ratios = [a / b for a, b in zip(f.again, f.floor, strict=True)]
            print(
                f"{size:>8,} | {f.idle * 1000:>6.2f} ms | {f.one_percent * 1000:>6.1f} ms | "
                f"{f.first * 1000:>11.0f} ms | {_ms(f.again):>22} | {_ms(f.floor):>22} | "
                f"{_spread(ratios):>17} | {f.tick_rate:>8,.0f} t/s"
            )
        print(
            "again/floor: each steady-state all-due sweep over the bare pipelined ZRANGEBYSCORE + "
            "ZADD + HINCRBY of the same members, measured right after it (goal <= 1.2; 100,000 "
            "all due <= 1 s); median (min-max) of 3"
        )
        size, sample = SIZES[-1], 10_000
        sweep, publishing, bare = bench_publish(url, root, size, sample)
        print(
            f"{size:,} dream lanes falling due at once (a nightly cron), turns published to the "
            f"Redis broker: sweep {sweep:.2f} s (goal <= 10 s), of it publishing "
            f"{publishing:.2f} s = {publishing / size * 1e6:.1f} µs per turn; bare send_task one "
            f"at a time right after, on a sample of {sample:,}: {bare * 1e6:.0f} µs per message "
            f"(x {size:,} = {bare * size:.1f} s), publishing ratio {publishing / (bare * size):.3f}"
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

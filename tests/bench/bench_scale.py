"""One million personas in a real Redis: memory per lane and sweep times (docs/scale.md).

Run:  .venv/bin/python -m tests.bench.bench_scale [--lanes N] [--due-share F]

Starts its own redis-server (:class:`~workers.local.redis_server.RedisServer`, no persistence,
so the figures are the data set's, not an AOF's), then:

1. registers N hourly heartbeat schedules the way the registry sync stores them (a member in
   the schedule sorted set, a canonical JSON spec in the spec hash) and reports Redis
   ``used_memory`` per schedule;
2. ticks every lane once (``Fleet.tick_lanes``, turn messages dropped: the broker is measured
   by bench_beat and bench_fleet), which creates each lane's hash, and reports memory per lane
   with its hash (the steady state of a fleet that has run);
3. times sweeps with nothing due (repeated: it must not grow with N), with ``--due-share`` of
   the lanes due (an hour's heartbeats arrive spread over the hour; 1/3600 of them are due in
   a one-second sweep) and with 1% due: each twice, first when the sweeper reads and parses
   those lanes' specs, then in the steady state of a beat that knows them;
4. prints the Redis server's CPU seconds over the run (``INFO cpu``) and the arithmetic the
   figures feed (docs/scale.md).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis
import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from beat.schedule import ScheduleSpec, to_ms
from beat.sweep import Sweeper
from tests.bench.bench_beat import NoopPublisher, _homes, _make_due
from workers.fleet import Fleet
from workers.local.redis_server import RedisServer
from workers.logs import configure_logging
from workers.settings import Settings

__all__ = ["main"]

CHUNK = 10_000


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _register(fleet: Fleet, specs: Sequence[ScheduleSpec], due_ms: int) -> None:
    for start in range(0, len(specs), CHUNK):
        chunk = specs[start : start + CHUNK]
        pipe = fleet.client.pipeline(transaction=False)
        pipe.hset(fleet.keys.schedule_spec, mapping={s.member: s.to_json() for s in chunk})
        pipe.zadd(fleet.keys.schedule, {s.member: due_ms for s in chunk})
        pipe.execute()
    fleet.client.incr(fleet.keys.schedule_epoch)


def _timed(fn: object) -> float:
    assert callable(fn)
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_scale", description=__doc__)
    parser.add_argument("--lanes", type=int, default=1_000_000, help="schedules (default 1M)")
    parser.add_argument("--due-share", type=float, default=1 / 3600, help="share due per sweep")
    args = parser.parse_args(argv)
    configure_logging("console", "WARNING", force=True)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,  # as workers/logs.py configures production
    )
    n = args.lanes
    with tempfile.TemporaryDirectory() as scratch, RedisServer(Path(scratch) / "redis") as server:
        settings = Settings.from_env(
            {"REDIS_URL": server.url, "SOULFLEET_PERSONAS": str(Path(scratch) / "personas")}
        )
        fleet = Fleet.from_settings(settings, publisher=NoopPublisher())
        client = fleet.client
        homes = _homes(Path(scratch) / "homes")
        cpu0, base = _cpu(client), _used(client)
        specs = [
            ScheduleSpec(lane=f"p{i:07d}", kind="heartbeat", persona=f"p{i:07d}",
                         home=str(homes[i % len(homes)]), every=3600.0, jitter=0.1)
            for i in range(n)
        ]  # fmt: skip
        members = [spec.member for spec in specs]
        took = _timed(lambda: _register(fleet, specs, to_ms(time.time() + 86_400)))
        scheduled = _used(client)
        per_schedule = (scheduled - base) / n
        print(f"bench_scale: {n:,} schedules registered in {took:.1f} s; Redis used_memory "
              f"{(scheduled - base) / 2**20:,.0f} MiB = {per_schedule:,.0f} B "
              "per schedule")  # fmt: skip
        pairs = [(spec.lane, "heartbeat") for spec in specs]
        took = _timed(lambda: [fleet.tick_lanes(pairs[i : i + 100_000])
                               for i in range(0, n, 100_000)])  # fmt: skip
        ticked = _used(client)
        print(f"  every lane ticked once (lane hashes created) in {took:.1f} s = "
              f"{n / took:,.0f} ticks/s; {(ticked - base) / 2**20:,.0f} MiB = "
              f"{(ticked - base) / n:,.0f} B per lane with its hash")  # fmt: skip
        sweeper = Sweeper(fleet)
        sweeper.run()
        idle = [_timed(sweeper.run) for _ in range(20)]
        print(f"  sweep, nothing due: median {statistics.median(idle) * 1000:.2f} ms "
              f"(min {min(idle) * 1000:.2f}, max {max(idle) * 1000:.2f}) "
              "over 20 sweeps")  # fmt: skip
        for share in (args.due_share, 0.01):
            due = members[:: max(1, round(1 / share))]
            times = []
            for _ in range(2):  # first: specs of these lanes read and parsed; then steady state
                _make_due(fleet, due)
                times.append(_timed(sweeper.run))
            print(f"  sweep, {len(due):,} due ({share:.4%}): first {times[0] * 1000:,.0f} ms, "
                  f"steady state {times[1] * 1000:,.0f} ms = "
                  f"{times[1] / len(due) * 1e6:.1f} µs per due lane")  # fmt: skip
        redis_cpu = _cpu(client) - cpu0
        print(f"  Redis server CPU over the whole run: {redis_cpu:.1f} s")
        fleet.client.close()


if __name__ == "__main__":
    main()

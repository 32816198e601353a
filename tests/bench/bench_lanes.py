"""Benchmark the lane scripts and PRINT the figures (no assertions: see tests/fleet/).

Run:  .venv/bin/python -m tests.bench.bench_lanes   (or: python tests/bench/bench_lanes.py)

Uses ``REDIS_URL`` if it answers, else starts its own redis-server (no persistence), so the
figures measure soulfleet plus one local Redis round trip, not a network.

* ticks/s through ``Lanes.tick_many`` (the sweep's hot path) for 1,000 / 10,000 / 100,000
  lanes: a first pass where every lane is idle (each tick queues a turn) and a second where
  every tick coalesces;
* the same 10,000 ticks one ``Lanes.tick`` call at a time, for contrast;
* post + start + finish cycles/s, one thread, sequential (each cycle is three script calls).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.redis import live_redis
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.persona.inbox import InboxItem

__all__ = ["bench_cycles", "bench_tick_many", "bench_tick_single", "main"]


def _lanes(client: redis.Redis, prefix: str) -> Lanes:
    return Lanes(
        client,
        Keys(prefix),
        inbox_max=1000,
        lease_ttl=30,
        max_attempts=5,
        beats_max=10_000,
        reply_ttl=3600,
    )


def _clean(client: redis.Redis, prefix: str) -> None:
    batch: list[str] = []
    for key in client.scan_iter(match=f"{prefix}*", count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)


def bench_tick_many(client: redis.Redis, n: int) -> tuple[float, float]:
    """(queueing ticks/s, coalescing ticks/s) for one tick_many over ``n`` lanes."""
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    lanes = _lanes(client, prefix)
    pairs = [(f"persona-{i}", "heartbeat") for i in range(n)]
    try:
        rates = []
        for expected in ("queued", "coalesced"):
            began = time.perf_counter()
            outcomes = lanes.tick_many(pairs)
            elapsed = time.perf_counter() - began
            assert len(outcomes) == n
            assert outcomes[-1].outcome == expected
            rates.append(n / elapsed)
        return rates[0], rates[1]
    finally:
        _clean(client, prefix)


def bench_tick_single(client: redis.Redis, n: int) -> float:
    """ticks/s with one Lanes.tick call (one round trip) per lane."""
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    lanes = _lanes(client, prefix)
    try:
        began = time.perf_counter()
        for i in range(n):
            lanes.tick(f"persona-{i}", kind="heartbeat")
        return n / (time.perf_counter() - began)
    finally:
        _clean(client, prefix)


def bench_cycles(client: redis.Redis, cycles: int, lane_count: int = 100) -> float:
    """post + start + finish cycles/s, sequential, spread over ``lane_count`` lanes."""
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    lanes = _lanes(client, prefix)
    try:
        began = time.perf_counter()
        for i in range(cycles):
            lane = f"persona-{i % lane_count}"
            item = InboxItem(
                text=f"message {i}",
                sender="bench",
                channel="api",
                id=uuid.uuid4().hex,
                at=time.time(),
            )
            posted = lanes.post(lane, item, wake=True)
            assert posted.turn_id is not None
            started = lanes.start(lane, posted.turn_id, "bench")
            lanes.finish(lane, started.fence, status="done", text="ok")
        return cycles / (time.perf_counter() - began)
    finally:
        _clean(client, prefix)


def main() -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,  # as workers/logs.py configures production
    )
    configured = os.environ.get("REDIS_URL", "").strip() or None
    with tempfile.TemporaryDirectory() as scratch, live_redis(configured, Path(scratch)) as url:
        source = "REDIS_URL" if url == configured else "own redis-server"
        client = redis.Redis.from_url(url, decode_responses=True)
        version = client.info("server").get("redis_version", "?")
        print(f"bench_lanes: Redis {version} ({source}), Python {sys.version.split()[0]}")
        print(f"{'lanes':>8}  {'tick_many queued/s':>19}  {'tick_many coalesced/s':>22}")
        for n in (1_000, 10_000, 100_000):
            queued, coalesced = bench_tick_many(client, n)
            print(f"{n:>8,}  {queued:>19,.0f}  {coalesced:>22,.0f}")
        single = bench_tick_single(client, 10_000)
        print(f"one Lanes.tick per round trip (10,000 lanes): {single:,.0f} ticks/s")
        cycles = bench_cycles(client, 5_000)
        print(f"post+start+finish, sequential (5,000 cycles): {cycles:,.0f} cycles/s")
        client.close()


if __name__ == "__main__":
    main()

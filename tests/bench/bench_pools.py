"""Every pool the settings accept, at its documented maximum concurrency: drains, or refused.

Run:  .venv/bin/python -m tests.bench.bench_pools [--turns N] [--pools threads,gevent,...]

For each pool (``threads``, ``gevent``, ``prefork``, ``solo``) at :func:`workers.pools.pool_limit`
on this machine, N turns (scripted model, one persona each, one item each) are queued before a
real ``celery -A workers worker -P <pool> -c <limit>`` starts; the worker drains them all, then
every lane is read back: the figure that matters is **stuck lanes** (a lane still ``queued`` or
``running`` after its turn ended, or left in the running index), which must be 0. Then a worker
one above the limit is started and must exit at once, naming the reason.

gevent is an optional dependency (``pip install 'soulfleet[gevent]'``): without it the pool is
reported as not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis
import structlog

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_fleet import BenchError, _clean, _Run, _write_personas, bench_turns
from tests.support.fleet import REPO
from tests.support.redis import live_redis
from workers.fleet.keys import Keys
from workers.pools import POOLS, pool_limit
from workers.settings import Settings

__all__ = ["main"]


def _stuck(settings: Settings, names: Sequence[str]) -> int:
    """Lanes not idle after the drain, plus members left in the running index."""
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = Keys(settings.key_prefix)
    try:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.hget(keys.lane(name), "state")
        states = pipe.execute()
        running = int(client.zcard(keys.running))
    finally:
        client.close()
    return sum(1 for state in states if state not in (None, "idle")) + running


def _refused(env: dict[str, str], pool: str, concurrency: int) -> str:
    """Start a worker above the limit; return the reason it printed (BenchError if it ran)."""
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-P", pool,
            "-c", str(concurrency), "--without-mingle", "--without-gossip"]  # fmt: skip
    try:
        done = subprocess.run(argv, env=env, cwd=str(REPO), capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{pool} -c {concurrency} was not refused: it ran") from exc
    lines = [line for line in done.stderr.splitlines() if "refused to start" in line]
    if done.returncode == 0 or not lines:
        raise BenchError(f"{pool} -c {concurrency} exited {done.returncode} without a reason")
    return lines[-1]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_pools", description=__doc__)
    parser.add_argument("--turns", type=int, default=1000, help="turns per pool (default 1000)")
    parser.add_argument("--pools", default=",".join(POOLS), help="comma-separated pools")
    parser.add_argument("--seconds", type=float, default=300.0, help="give up after (per pool)")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    scratch = Path(tempfile.mkdtemp(prefix="sfpools-"))
    rows: list[str] = []
    try:
        with live_redis(None, scratch / "redis") as url:
            run = _Run(url, f"sfpools:{uuid.uuid4().hex[:10]}:", scratch, {})
            run.logs.mkdir(parents=True)
            try:
                for pool in args.pools.split(","):
                    rows.append(_one(run, pool, args.turns, args.seconds))
            finally:
                _clean(url, run.prefix)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"bench_pools: {args.turns} turns per pool, {os.cpu_count()} cores")
    print(f"{'pool':<8} {'max -c':>6} {'turns/s':>8} {'stuck':>5}  above the limit")
    print("\n".join(rows))


def _one(run: _Run, pool: str, turns: int, seconds: float) -> str:
    limit = pool_limit(pool)
    if pool == "gevent" and importlib.util.find_spec("gevent") is None:
        return f"{pool:<8} {limit:>6} {'-':>8} {'-':>5}  not installed (soulfleet[gevent])"
    print(f"bench_pools: {pool} -c {limit}, {turns} turns ...", file=sys.stderr, flush=True)
    root = run.scratch / pool
    names = _write_personas(root, turns, scripted=True)
    more = {"SOULFLEET_WORKER_POOL": pool, "SOULFLEET_WORKER_CONCURRENCY": str(limit)}
    env = run.env(pool, root, more)
    result = bench_turns(pool, pool, env, run.logs, names, warmup=turns // 10, seconds=seconds)
    stuck = _stuck(Settings.from_env(env), names)
    if pool == "solo":
        above = "solo runs one turn at a time whatever -c says: never refused"
    else:
        above = _refused({**env, "SOULFLEET_WORKER_CONCURRENCY": "1"}, pool, limit + 1)
        above = "refused: " + above.split("refused to start: ", 1)[-1][:90]
    return f"{pool:<8} {limit:>6} {result.rate:>8,.1f} {stuck:>5}  {above}"


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        print(f"bench_pools: FAILED: {exc}", file=sys.stderr)
        sys.exit(1)

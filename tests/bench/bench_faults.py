"""Production faults against a real fleet, and PRINT what happened (issue 10).

Run:  .venv/bin/python -m tests.bench.bench_faults [--personas 200] [--failing 30]
      [--refusing 30] [--post-every 0.05] [--lost 3] [--concurrency 16] [--keep]

1. A provider outage during steady traffic (:mod:`tests.support.outage`): ``--personas``
   personas on ``model = "openai:fake"``, a poster posting one item every ``--post-every`` s to
   a random persona; the provider answers HTTP 500 for ``--failing`` s, then refuses
   connections for ``--refusing`` s, then comes back. Printed: items posted, model calls made
   during the outage (bounded by the provider breaker), when the breaker opened, lanes
   dead-lettered (should be 0), items never processed (should be 0), and the time from
   recovery to a drained backlog.
2. A worker killed between taking a turn message and starting the turn, ``--lost`` times
   (:mod:`tests.support.lost_message`), at the default ``SOULFLEET_CLAIM_TTL``: seconds from
   the death until the lane runs again on another worker (issue: within 10 s, not the 600 s of
   ``SOULFLEET_REAP_QUEUED_AFTER``).

Real ``celery -A workers worker`` and ``beat`` processes on a real Redis (``REDIS_URL`` if it
answers, else its own redis-server); every key and process of the run is cleaned up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.fleet import FleetProcess, fleet_env, start_beat, start_worker
from tests.support.lost_message import lose_one_message
from tests.support.outage import run_outage
from tests.support.redis import live_redis
from workers.publisher import connect
from workers.settings import Settings

__all__ = ["main"]


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_faults")
    parser.add_argument("--personas", type=int, default=200)
    parser.add_argument("--warm", type=float, default=10.0)
    parser.add_argument("--failing", type=float, default=30.0, help="seconds of HTTP 500")
    parser.add_argument("--refusing", type=float, default=30.0, help="seconds refused")
    parser.add_argument("--post-every", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--lost", type=int, default=3, help="lost-message rounds")
    parser.add_argument("--keep", action="store_true", help="keep logs and personas")
    return parser.parse_args(list(argv) if argv is not None else None)


def _clean(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.delete(key)
    client.close()


def _outage(url: str, scratch: Path, args: argparse.Namespace) -> list[str]:
    prefix = f"sfbench:{uuid.uuid4().hex[:10]}:"
    root, logs = scratch / "outage" / "personas", scratch / "outage" / "logs"
    root.mkdir(parents=True)
    env = fleet_env(redis_url=url, key_prefix=prefix, personas=root)
    try:
        result = run_outage(
            env,
            root,
            logs,
            personas=args.personas,
            warm=args.warm,
            failing=args.failing,
            refusing=args.refusing,
            post_every=args.post_every,
            concurrency=args.concurrency,
            drain_timeout=600,
            say=_say,
        )
    finally:
        _clean(url, prefix)
    return result.lines()


def _lost(url: str, scratch: Path, rounds: int) -> list[str]:
    prefix = f"sfbench:{uuid.uuid4().hex[:10]}:"
    root, logs = scratch / "lost" / "personas", scratch / "lost" / "logs"
    (root / "ava").mkdir(parents=True)
    (root / "ava" / "persona.toml").write_text('model = "scripted:rules.toml"\n')
    (root / "ava" / "rules.toml").write_text('[[rules]]\ntext = "ok"\n')
    env = fleet_env(
        redis_url=url,
        key_prefix=prefix,
        personas=root,
        extra={"CRASH_BEFORE_START_LANE": "ava"},
    )
    processes: list[FleetProcess] = []
    fleet = connect(Settings.from_env(env))
    seconds: list[float] = []
    try:
        processes.append(start_beat(env, logs))
        processes.append(start_worker(env, logs, name="rescuer"))
        for index in range(rounds):
            took = lose_one_message(
                fleet, env, logs, lane="ava", name=f"doomed{index}", processes=processes
            )
            _say(f"lost message {index + 1}: the lane ran again after {took:.2f} s")
            seconds.append(took)
    finally:
        for process in processes:
            process.stop()
        fleet.client.close()
        _clean(url, prefix)
    ttl = Settings.from_env(env).claim_ttl
    return [
        f"lost message -> lane runs again  {', '.join(f'{s:.1f}' for s in seconds)} s "
        f"(median {statistics.median(seconds):.1f} s; SOULFLEET_CLAIM_TTL {ttl:g} s, "
        f"SOULFLEET_REAP_QUEUED_AFTER {Settings.from_env(env).reap_queued_after:g} s)"
    ]


def main(argv: Sequence[str] | None = None) -> None:
    args = _arguments(argv)
    scratch = Path(tempfile.mkdtemp(prefix="sfbench-faults-"))
    lines: list[str] = []
    try:
        configured = os.environ.get("REDIS_URL", "").strip() or None
        with live_redis(configured, scratch / "redis") as url:
            if args.lost > 0:
                lines += _lost(url, scratch, args.lost)
            if args.personas > 0:
                lines += _outage(url, scratch, args)
    finally:
        if args.keep:
            _say(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print("\nbench_faults")
    for line in lines:
        print(f"  {line}")


if __name__ == "__main__":
    main()

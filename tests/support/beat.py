"""Helpers for beat's tests: persona directories, a recording publisher, fleets on a test prefix.

Also a command (``python -m tests.support.beat race …``) that runs sweeps in a separate OS
process, so a test can race two real processes on one Redis: it waits for a start signal key,
sweeps until nothing is due, and prints the members it ticked as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from beat.schedule import ScheduleSpec, to_ms
from beat.sweep import Sweeper
from workers.fleet import Fleet
from workers.fleet.keys import Keys, split_schedule_member
from workers.fleet.sweeps import PendingApply
from workers.logs import configure_logging
from workers.persona.clock import Clock
from workers.settings import Settings

__all__ = [
    "MAX_RACE_PASSES",
    "RecordingPublisher",
    "RecordingTicks",
    "fleet_for",
    "hourly_specs",
    "lane_ticks",
    "register",
    "settings_for",
    "write_persona",
]


#: Sweep passes a racer makes at most before it calls the race a failure (a due set that never
#: empties is a bug to report, not a reason to hang the suite).
MAX_RACE_PASSES = 200


class RecordingPublisher:
    """A Publisher that records ``(lane, turn_id, kind)`` instead of sending Celery messages."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        self.publish_many([(lane, turn_id, kind)])

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        with self._lock:
            self.sent.extend(turns)

    def lanes(self) -> list[str]:
        return [lane for lane, _, _ in self.sent]


class RecordingTicks:
    """Wraps a fleet's sweep writes and records every (lane, kind) the sweep ticked, per
    claimed batch (skipped members are re-scored but not ticked, so not recorded)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.pairs: list[tuple[str, str]] = []
        self.calls: list[list[tuple[str, str]]] = []
        original = fleet.sweeps.start_apply

        def start_apply(claim_ms: int, now_ms: int, lines: Sequence[str]) -> PendingApply:
            ticked = []
            for line in lines:
                member, _, tick = line.split("\t")
                if tick != "-":
                    ticked.append(split_schedule_member(member))
            self.pairs.extend(ticked)
            self.calls.append(ticked)
            return original(claim_ms, now_ms, lines)

        fleet.sweeps.start_apply = start_apply  # type: ignore[method-assign]


def settings_for(redis_url: str, key_prefix: str, personas: Path, **extra: str) -> Settings:
    """Settings for a fleet on this test's Redis, prefix and personas root."""
    env = {
        "REDIS_URL": redis_url,
        "SOULFLEET_KEY_PREFIX": key_prefix,
        "SOULFLEET_PERSONAS": str(personas),
        **extra,
    }
    return Settings.from_env(env)


def fleet_for(
    settings: Settings,
    *,
    clock: Clock | None = None,
    publisher: RecordingPublisher | None = None,
) -> Fleet:
    """A real Fleet (real Redis) whose turn messages go to a recording publisher."""
    return Fleet.from_settings(settings, publisher=publisher or RecordingPublisher(), clock=clock)


def write_persona(
    root: Path, name: str, toml: str | None = None, heartbeat: str | None = "Check the inbox.\n"
) -> Path:
    """Create (or rewrite) ``root/name`` with persona.toml and HEARTBEAT.md (None: absent)."""
    home = root / name
    home.mkdir(parents=True, exist_ok=True)
    for filename, text in (("persona.toml", toml), ("HEARTBEAT.md", heartbeat)):
        path = home / filename
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text, encoding="utf-8")
    return home


def register(client: redis.Redis, keys: Keys, specs: Sequence[ScheduleSpec], due: float) -> None:
    """Put schedule entries straight into Redis, all due at ``due`` (benchmarks, races)."""
    for start in range(0, len(specs), 5000):
        pipe = client.pipeline(transaction=False)
        chunk = specs[start : start + 5000]
        pipe.hset(keys.schedule_spec, mapping={spec.member: spec.to_json() for spec in chunk})
        pipe.zadd(keys.schedule, {spec.member: to_ms(due) for spec in chunk})
        pipe.incr(keys.schedule_epoch)
        pipe.execute()


def hourly_specs(
    home: Path, count: int, prefix: str = "lane", *, quiet_after: float | None = None
) -> list[ScheduleSpec]:
    """Hourly heartbeat specs for ``count`` lanes, all pointing at one real persona home.

    Each lane's grid phase is spread over the hour, so a sweep running on the real clock sees
    about one lane per 1.2 s come due AGAIN (a new slot: a correct second tick). A test that
    counts ticks per lane on the real clock passes ``quiet_after`` (epoch seconds): only lanes
    whose next slot after it is at least ten minutes later are kept.
    """
    specs: list[ScheduleSpec] = []
    index = 0
    while len(specs) < count:
        spec = ScheduleSpec(
            lane=f"{prefix}{index:05d}",
            kind="heartbeat",
            persona="shared",
            home=str(home),
            every=3600.0,
        )
        index += 1
        if quiet_after is None or spec.next_due(quiet_after) - quiet_after >= 600:
            specs.append(spec)
    return specs


def lane_ticks(client: redis.Redis, keys: Keys, lanes: Sequence[str]) -> dict[str, int]:
    """Each lane's pending tick count as stored in its Redis hash (0 when never ticked)."""
    pipe = client.pipeline(transaction=False)
    for lane in lanes:
        pipe.hget(keys.lane(lane), "ticks")
    return {lane: int(value or 0) for lane, value in zip(lanes, pipe.execute(), strict=True)}


def _race(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tests.support.beat race")
    parser.add_argument("--redis", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--personas", required=True)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--go", required=True, help="key whose existence starts the race")
    parser.add_argument("--ready", required=True, help="key this racer INCRs once it is set up")
    args = parser.parse_args(argv)
    configure_logging("json", "WARNING")  # stdout carries the result; logs go to stderr
    settings = settings_for(args.redis, args.prefix, Path(args.personas))
    fleet = fleet_for(settings)
    ticks = RecordingTicks(fleet)
    sweeper = Sweeper(fleet, batch=args.batch)
    fleet.client.incr(args.ready)
    deadline = time.monotonic() + 60
    while not fleet.client.exists(args.go):
        if time.monotonic() > deadline:
            return 2
        time.sleep(0.001)
    for _ in range(MAX_RACE_PASSES):  # bounded: a sweep that never drains fails, not hangs
        if not sweeper.run().due:
            break
    else:
        print(f"still due after {MAX_RACE_PASSES} sweep passes", file=sys.stderr)
        return 3
    json.dump([f"{lane}|{kind}" for lane, kind in ticks.pairs], sys.stdout)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["race"]:
        sys.exit("usage: python -m tests.support.beat race --redis URL --prefix P --personas DIR")
    sys.exit(_race(sys.argv[2:]))

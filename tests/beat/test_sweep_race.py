"""beat/sweep.py under contention: two sweepers (threads, then OS processes) on one Redis
never claim the same due member twice, so no lane is ever double-ticked."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from beat.sweep import Sweeper
from tests.support.beat import (
    MAX_RACE_PASSES,
    RecordingTicks,
    fleet_for,
    hourly_specs,
    lane_ticks,
    register,
    write_persona,
)
from tests.support.fleet import REPO, wait_until
from workers.fleet import Fleet
from workers.persona.clock import VirtualClock
from workers.settings import Settings

EVERY_1M = '[heartbeat]\nevery = "1m"\n'


def _assert_claimed_once(
    client: redis.Redis, settings: Settings, claims: list[list[str]], count: int
) -> None:
    everything = [member for claim in claims for member in claim]
    assert len(everything) == len(set(everything)) == count
    assert all(claim for claim in claims), "every racer must have won some claims"
    keys = fleet_for(settings).keys
    lanes = [member.rpartition("|")[0] for member in everything]
    assert set(lane_ticks(client, keys, lanes).values()) == {1}


def test_two_sweeper_threads_never_claim_one_member_twice(
    settings: Settings, persona_root: Path, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """Two sweepers racing in threads on one Redis tick each of 2,000 due lanes exactly once."""
    home = write_persona(persona_root, "shared", EVERY_1M)
    keys = fleet_for(settings).keys
    register(redis_client, keys, hourly_specs(home, 2000), due=clock.time())
    clock.advance(1)
    fleets = [fleet_for(settings, clock=clock) for _ in range(2)]
    recorders = [RecordingTicks(f) for f in fleets]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def race(fleet: Fleet) -> None:
        try:
            sweeper = Sweeper(fleet, batch=25)
            barrier.wait()
            for _ in range(MAX_RACE_PASSES):  # bounded: never-draining sweeps fail, not hang
                if not sweeper.run().due:
                    return
            raise AssertionError(f"still due after {MAX_RACE_PASSES} sweep passes")
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(f,)) for f in fleets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a sweeper thread never finished"
    assert errors == []
    claims = [[f"{lane}|{kind}" for lane, kind in r.pairs] for r in recorders]
    _assert_claimed_once(redis_client, settings, claims, 2000)


@pytest.mark.integration
def test_two_sweeper_processes_never_claim_one_member_twice(
    *,
    settings: Settings,
    redis_url: str,
    key_prefix: str,
    persona_root: Path,
    redis_client: redis.Redis,
) -> None:
    """Two OS processes sweeping one Redis at once tick each of 3,000 due lanes exactly once."""
    home = write_persona(persona_root, "shared", EVERY_1M)
    keys = fleet_for(settings).keys
    # Real clock: keep lanes whose next slot is far off, so none is legitimately due twice.
    now = time.time()
    register(redis_client, keys, hourly_specs(home, 3000, quiet_after=now), due=now - 1)
    go, ready = f"{key_prefix}race:go", f"{key_prefix}race:ready"
    argv = [
        sys.executable, "-m", "tests.support.beat", "race",
        "--redis", redis_url, "--prefix", key_prefix, "--personas", str(persona_root),
        "--batch", "20", "--go", go, "--ready", ready,
    ]  # fmt: skip
    racers = [
        subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        # Both must be built and polling before the start signal, or one would sweep alone.
        wait_until(lambda: redis_client.get(ready) == "2", timeout=60, what="both racers ready")
        redis_client.set(go, "1")
        outputs = [racer.communicate(timeout=120) for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait()
    for racer, (_, err) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, err
    claims = [json.loads(out) for out, _ in outputs]
    _assert_claimed_once(redis_client, settings, claims, 3000)

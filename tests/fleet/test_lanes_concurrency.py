"""Lanes under real concurrency: OS processes racing posts, ticks, starts and finishes."""

from __future__ import annotations

import itertools
import multiprocessing
import random
import time
from collections import Counter

import pytest
import redis

from tests.support.lanes import hammer, make_lanes, work_one

LANES = 3
PROCESSES = 4
SECONDS = 4.0


def _drain(client: redis.Redis, prefix: str) -> None:
    """Run every remaining turn to completion (no chaos), repairing stranded lanes."""
    lanes = make_lanes(client, prefix, inbox_max=100_000, lease_ttl=0.3, max_attempts=10_000)
    names = [f"lane{i}" for i in range(LANES)]
    rng = random.Random(0)
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, [lanes.status(n) for n in names]
        while work_one(client, lanes, prefix, "drain", rng, chaos=False):
            pass
        statuses = [lanes.status(n) for n in names]
        if all(
            s["state"] == "idle" and s["inbox_depth"] == 0 and s["inflight_items"] == 0
            for s in statuses
        ):
            return
        for name, status in zip(names, statuses, strict=True):
            if status["state"] == "idle":  # items posted without wake
                for tick in lanes.tick_many([(name, "heartbeat")]):
                    if tick.turn_id:
                        client.rpush(f"{prefix}t:msgs", f"{name}|{tick.turn_id}")
        for repair in lanes.reap(queued_after=0.05):
            client.rpush(f"{prefix}t:msgs", f"{repair.lane}|{repair.turn_id}")
        time.sleep(0.05)


@pytest.mark.integration
def test_racing_processes_never_overlap_turns_and_consume_every_item_once(
    redis_client: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    """4 processes x 4 s on 3 lanes, with crashes, duplicates and late finishes: no second
    start while a lease is live, committed turns never overlap, every item consumed once."""
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=hammer,
            args=(redis_url, key_prefix),
            kwargs={"lanes_n": LANES, "seconds": SECONDS, "seed": seed, "worker": f"w{seed}"},
        )
        for seed in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    _drain(redis_client, key_prefix)

    posted = redis_client.smembers(f"{key_prefix}t:posted")
    consumed = Counter(redis_client.lrange(f"{key_prefix}t:consumed", 0, -1))
    assert len(posted) > 100, "too little traffic for the test to mean anything"
    assert set(consumed) == posted
    assert [i for i, n in consumed.items() if n != 1] == []

    assert redis_client.lrange(f"{key_prefix}t:violations", 0, -1) == []
    committed = 0
    for lane in range(LANES):
        turns = [
            tuple(int(x) for x in str(raw).split(":"))
            for raw in redis_client.lrange(f"{key_prefix}t:turns:lane{lane}", 0, -1)
        ]
        committed += len(turns)
        turns.sort()
        for (_s1, e1, f1), (s2, _e2, f2) in itertools.pairwise(turns):
            assert e1 < s2, f"lane{lane}: turn fence {f1} still ran when fence {f2} started"
            assert f1 < f2
    assert committed > 50

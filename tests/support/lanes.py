"""Helpers for the lane, lease and gate tests: builders, and the code real child processes run.

The multi-process tests start real OS processes that run :func:`hammer` (lanes) or
``python -m tests.support.lanes gate-hold|gate-contend`` (the gate). Each records what it did
in Redis under the test's key prefix, and the test checks the invariants from those records.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Sequence

import redis

from workers.fleet.breaker import Breaker
from workers.fleet.errors import LeaseLost
from workers.fleet.gate import Gate
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.lease import Renewer
from workers.persona.clock import Clock
from workers.persona.inbox import InboxItem

__all__ = [
    "dump_keys",
    "gate_main",
    "hammer",
    "item",
    "make_breaker",
    "make_lanes",
    "record_max",
    "work_one",
]


def make_lanes(
    client: redis.Redis,
    prefix: str,
    *,
    inbox_max: int = 5,
    lease_ttl: float = 30.0,
    max_attempts: int = 3,
    beats_max: int = 100,
    reply_ttl: float = 60.0,
    item_max_bytes: int = 64 * 1024,
    beat_max_bytes: int = 4096,
    drain_max_bytes: int = 0,
    clock: Clock | None = None,
) -> Lanes:
    """A Lanes on ``client`` with small, test-friendly limits."""
    return Lanes(
        client,
        Keys(prefix),
        inbox_max=inbox_max,
        lease_ttl=lease_ttl,
        max_attempts=max_attempts,
        beats_max=beats_max,
        reply_ttl=reply_ttl,
        item_max_bytes=item_max_bytes,
        beat_max_bytes=beat_max_bytes,
        drain_max_bytes=drain_max_bytes,
        clock=clock,
    )


def make_breaker(client: redis.Redis, prefix: str, *, clock: Clock) -> Breaker:
    """A Breaker on ``client`` that opens on half of at least 4 calls in 30 s failing, and lets
    one probe through every 10 s."""
    return Breaker(
        client,
        Keys(prefix),
        window=30,
        min_calls=4,
        failure_ratio=0.5,
        probe_interval=10,
        probe_ttl=60,
        clock=clock,
    )


def item(text: str, *, sender: str = "external", reply: bool = False) -> InboxItem:
    """A fresh inbox item with a unique id."""
    return InboxItem(
        text=text, sender=sender, channel="api", id=uuid.uuid4().hex, at=1.0, reply=reply
    )


def dump_keys(client: redis.Redis, prefix: str) -> dict[str, object]:
    """Every key under ``prefix`` with its full value and TTL presence, for before/after diffs."""
    snapshot: dict[str, object] = {}
    for key in sorted(client.scan_iter(match=f"{prefix}*", count=1000)):
        kind = client.type(key)
        value: object
        if kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(key)
        else:
            value = client.get(key)
        snapshot[key] = (kind, value)
    return snapshot


_RECORD_MAX = """
local n = redis.call('INCR', KEYS[1])
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > m then redis.call('SET', KEYS[2], n) end
return n
"""


def record_max(client: redis.Redis, active: str, peak: str) -> int:
    """INCR ``active`` and keep ``peak`` = the highest value it ever had (atomically)."""
    return int(client.eval(_RECORD_MAX, 2, active, peak))


# -- the lanes hammer (multiprocessing target) ----------------------------------------------
def _send(client: redis.Redis, prefix: str, lane: str, turn_id: str | None) -> None:
    # The test's stand-in for the broker: a list of (lane, turn id) wake-ups.
    if turn_id is not None:
        client.rpush(f"{prefix}t:msgs", f"{lane}|{turn_id}")


def hammer(url: str, prefix: str, *, lanes_n: int, seconds: float, seed: int, worker: str) -> None:
    """Post, tick, start and finish at random on a few lanes, recording what committed.

    Some turns "crash" (abandoned with their message re-sent, as a broker redelivers), some
    messages are delivered twice, some finishes come late (after the lease ran out).
    Records under ``<prefix>t:``: ``posted`` (set of accepted item ids), ``consumed`` (item
    ids of committed turns), ``turns:<lane>`` ("<s>:<e>:<fence>" per committed turn, s/e from
    one INCR sequence taken after start returned and before finish was called),
    ``violations`` (a holder whose lease was provably live lost its lane: a second start
    happened while it ran) and ``lost`` (finishes refused, e.g. after a late finish).
    """
    rng = random.Random(seed)
    client = redis.Redis.from_url(url, decode_responses=True)
    lanes = make_lanes(client, prefix, inbox_max=100_000, lease_ttl=0.3, max_attempts=10_000)
    names = [f"lane{i}" for i in range(lanes_n)]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        roll = rng.random()
        lane = rng.choice(names)
        if roll < 0.3:
            new = item(f"from {worker}")
            outcome = lanes.post(lane, new, wake=rng.random() < 0.8)
            client.sadd(f"{prefix}t:posted", new.id)
            _send(client, prefix, lane, outcome.turn_id)
        elif roll < 0.5:
            for tick in lanes.tick_many([(lane, "heartbeat")] * rng.randint(1, 5)):
                _send(client, prefix, lane, tick.turn_id)
        elif roll < 0.52:
            for repair in lanes.reap(queued_after=0.5):
                _send(client, prefix, repair.lane, repair.turn_id)
        else:
            work_one(client, lanes, prefix, worker, rng)
    client.close()


def work_one(
    client: redis.Redis,
    lanes: Lanes,
    prefix: str,
    worker: str,
    rng: random.Random,
    *,
    chaos: bool = True,
) -> bool:
    """Take one wake-up off the stand-in broker and run its turn; False if there was none.

    With ``chaos``, some deliveries are duplicated, some turns crash, some finish late.
    """
    msg = client.lpop(f"{prefix}t:msgs")
    if not isinstance(msg, str):
        return False
    lane, _, turn_id = msg.partition("|")
    if chaos and rng.random() < 0.05:
        client.rpush(f"{prefix}t:msgs", msg)  # a duplicate delivery
    began = time.monotonic()
    started = lanes.start(lane, turn_id, worker)
    if started.status != "started":
        return True
    s = int(client.incr(f"{prefix}t:seq"))
    if chaos and rng.random() < 0.05:
        # Crash: never finish; the broker redelivers the message later.
        client.rpush(f"{prefix}t:msgs", msg)
        return True
    late = chaos and rng.random() < 0.05
    time.sleep(0.35 if late else rng.uniform(0.0, 0.004))
    e = int(client.incr(f"{prefix}t:seq"))
    replies = [it.id for it in started.items if it.reply]
    try:
        done = lanes.finish(lane, started.fence, status="done", text="ok", reply_ids=replies)
    except LeaseLost:
        # The lease was set during start and is checked during finish, so it was at most
        # `elapsed` old: younger than its TTL means it was live, and a live lease can only be
        # lost if someone else started this lane meanwhile. That must never happen.
        elapsed = time.monotonic() - began
        if elapsed < lanes.lease_ttl:
            client.rpush(f"{prefix}t:violations", f"{lane}:{started.fence}:{elapsed:.3f}")
        client.incr(f"{prefix}t:lost")
        return True
    client.rpush(f"{prefix}t:turns:{lane}", f"{s}:{e}:{started.fence}")
    if started.items:
        client.rpush(f"{prefix}t:consumed", *[it.id for it in started.items])
    _send(client, prefix, lane, done.follow_up_turn_id)
    return True


# -- gate child processes --------------------------------------------------------------------
def gate_main(argv: Sequence[str] | None = None) -> None:
    """``gate-contend``: threads loop over gate slots, recording concurrent holders.
    ``gate-hold``: take one slot, print its token, keep renewing it until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("gate-contend", "gate-hold"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--slot-ttl", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    client = redis.Redis.from_url(args.url, decode_responses=True)
    renewer = Renewer(ttl=args.slot_ttl)
    gate = Gate(
        client, Keys(args.prefix), limit=args.limit, slot_ttl=args.slot_ttl, renewer=renewer
    )
    if args.mode == "gate-hold":
        with gate.slot(timeout=10) as slot:
            print(f"held {slot.token}", flush=True)
            while True:
                time.sleep(1)

    deadline = time.monotonic() + args.seconds

    def contend() -> None:
        while time.monotonic() < deadline:
            with gate.slot(timeout=30):
                record_max(client, f"{args.prefix}t:active", f"{args.prefix}t:peak")
                client.incr(f"{args.prefix}t:calls")
                time.sleep(random.uniform(0.005, 0.02))
                client.decr(f"{args.prefix}t:active")

    threads = [threading.Thread(target=contend) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    renewer.stop()
    print(f"done {os.getpid()}", flush=True)


if __name__ == "__main__":
    gate_main(sys.argv[1:])

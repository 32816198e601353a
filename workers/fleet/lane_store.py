"""The Redis side every lane operation shares: the client (checked to decode replies), the key
names, the registered scripts, the clock (time goes into scripts as ARGV, in ms, so tests drive
it) and one way to run several script calls in a round trip. :class:`~workers.fleet.lanes.Lanes`
is built on it, with its reads (:mod:`workers.fleet.lane_reports`) and repairs
(:mod:`workers.fleet.lane_repairs`) beside the transitions.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script

from workers.fleet.keys import Keys
from workers.fleet.scripts import Scripts, redis_errors
from workers.persona.clock import Clock, SystemClock

__all__ = ["LaneStore", "new_turn_id"]


def new_turn_id() -> str:
    """A turn id (Lua has no good randomness; a script uses the id only if it queues a turn)."""
    return uuid.uuid4().hex


class LaneStore:
    """Settings and Redis plumbing of the lanes of one fleet. Thread-safe."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        inbox_max: int,
        lease_ttl: float,
        max_attempts: int,
        beats_max: int,
        reply_ttl: float,
        item_max_bytes: int = 64 * 1024,
        beat_max_bytes: int = 4096,
        clock: Clock | None = None,
    ) -> None:
        if not client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("Lanes needs a redis client made with decode_responses=True")
        for name, value in (
            ("inbox_max", inbox_max),
            ("max_attempts", max_attempts),
            ("beats_max", beats_max),
            ("item_max_bytes", item_max_bytes),
            ("beat_max_bytes", beat_max_bytes),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if lease_ttl <= 0 or reply_ttl <= 0:
            raise ValueError("lease_ttl and reply_ttl must be > 0")
        self.client = client
        self.keys = keys
        self.inbox_max = inbox_max
        self.item_max_bytes = item_max_bytes
        self.lease_ttl = lease_ttl
        self.max_attempts = max_attempts
        self.beats_max = beats_max
        self.beat_max_bytes = beat_max_bytes
        self.reply_ttl = reply_ttl
        self.clock: Clock = clock or SystemClock()
        self.scripts = Scripts.register(client)

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def _ms(self, seconds: float) -> int:
        return max(1, int(seconds * 1000))

    def _run(
        self,
        calls: Sequence[tuple[Script, list[str], list[str | int]]],
        *,
        isolated: bool = False,
    ) -> list[Any]:
        """Run script calls in ONE round trip: directly if there is one, else pipelined
        (a pipeline adds a SCRIPT EXISTS check, worth it only for several calls).

        ``isolated``: a call that fails in Redis (a key of the wrong type...) comes back as
        its exception in its place instead of failing the others (the reaper's repairs)."""
        if not calls:
            return []
        with redis_errors(self.client):
            if len(calls) == 1:
                script, keys, args = calls[0]
                try:
                    return [script(keys=keys, args=args)]
                except redis.ResponseError as exc:
                    if not isolated:
                        raise
                    return [exc]
            pipe = self.client.pipeline(transaction=False)
            for script, keys, args in calls:
                script(keys=keys, args=args, client=pipe)
            return list(pipe.execute(raise_on_error=not isolated))

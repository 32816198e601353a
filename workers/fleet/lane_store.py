"""The Redis side every lane operation shares: the client (checked to decode replies), the key
names, the registered scripts and the clock (time goes into scripts as ARGV, in ms, so tests
drive it); several script calls go in one round trip through
:func:`workers.fleet.scripts.run_scripts`. :class:`~workers.fleet.lanes.Lanes` is built on it,
with its reads (:mod:`workers.fleet.lane_reports`) and repairs (:mod:`workers.fleet.lane_repairs`)
beside the transitions.
"""

from __future__ import annotations

import uuid

import redis

from workers.fleet.keys import Keys
from workers.fleet.scripts import Scripts
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
        drain_max_bytes: int = 0,
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
        #: the most bytes of inbox items one turn takes (0: all): start.lua's ARGV[7]
        self.drain_max_bytes = max(0, drain_max_bytes)
        self.clock: Clock = clock or SystemClock()
        self.scripts = Scripts.register(client)

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def _ms(self, seconds: float) -> int:
        return max(1, int(seconds * 1000))

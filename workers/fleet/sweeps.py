"""The sweep's batched Redis writes and reads: one script call per claimed batch, not per lane.

Beat's sweep (:mod:`beat.sweep`) claims due schedule members, decides in Python which to skip
(files, active hours, spend), and then hands the whole batch here:

- :meth:`SweepWrites.apply` runs ``lua/sweep_apply.lua``: every member's next due time
  (compare-and-set on the claim score, so a concurrent registry sync or a re-claim wins) and a
  tick folded into each ticked member's lane, exactly as ``lua/tick.lua`` folds it (coalescing;
  a turn queued only for an idle lane; a dead-lettered lane untouched).
- :meth:`SweepWrites.fields` reads one field from each of many hashes (the spend checks).

Both take ONE string argument and give back ONE string: at 100,000 lanes the per-key encoding
and per-element reply parsing of redis-py cost more than the Redis work itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from workers.fleet.keys import Keys
from workers.fleet.scripts import redis_errors, script_source

__all__ = ["AppliedBatch", "SweepWrites"]


@dataclass(frozen=True, slots=True)
class AppliedBatch:
    """What one :meth:`SweepWrites.apply` did to its ticked members, in order.

    ``codes[i]`` is the i-th ticked member's outcome: ``q`` queued (turn id
    :meth:`turn_id` ``(i)``), ``c`` coalesced, ``d`` dead-lettered (lane unchanged)."""

    codes: str
    base: str

    def turn_id(self, index: int) -> str:
        return f"{self.base}{index:08x}"


class SweepWrites:
    """The sweep's scripts on one client (registering makes no round trip)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._apply = client.register_script(script_source("sweep_apply"))
        self._fields = client.register_script(script_source("hash_fields"))
        self._lane_prefix = keys.lane("")

    def apply(self, claim_ms: int, now_ms: int, lines: Sequence[str]) -> AppliedBatch:
        """Re-score and tick one claimed batch. ``lines``: ``"<member>\\t<next ms>\\t<tick>"``
        per member, tick ``h`` (heartbeat), ``d`` (dream) or ``-`` (skipped: re-scored only).
        Members and lanes never contain a tab or newline (registry names forbid them)."""
        # Turn ids: uuid4 entropy per call (24 hex digits) + an 8-digit per-tick counter.
        base = uuid.uuid4().hex[:24]
        if not lines:
            return AppliedBatch("", base)
        with redis_errors(self.client):
            codes = self._apply(
                keys=[self.keys.schedule, self.keys.queued],
                args=[claim_ms, now_ms, self._lane_prefix, base, "\n".join(lines)],
            )
        return AppliedBatch(str(codes), base)

    def fields(self, reads: Sequence[str]) -> list[str]:
        """One field per hash: ``reads`` are ``"<key>\\t<field>"``; ``""`` for a missing one.
        ``ValueError`` if a value held a newline (the answer would not line up)."""
        if not reads:
            return []
        with redis_errors(self.client):
            reply = str(self._fields(keys=[], args=["\n".join(reads)]))
        values = reply.split("\n")
        if len(values) != len(reads):
            raise ValueError(f"{len(values)} values for {len(reads)} hash fields")
        return values

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
from typing import Any

import redis
from redis.connection import Connection

from workers.fleet.keys import Keys
from workers.fleet.scripts import redis_errors, script_source

__all__ = ["AppliedBatch", "PendingApply", "SweepWrites"]


@dataclass(frozen=True, slots=True)
class AppliedBatch:
    """What one :meth:`SweepWrites.apply` did to its ticked members, in order.

    ``codes[i]`` is the i-th ticked member's outcome: ``q`` queued (turn id
    :meth:`turn_id` ``(i)``), ``c`` coalesced, ``d`` dead-lettered (lane unchanged)."""

    codes: str
    base: str

    def turn_id(self, index: int) -> str:
        return f"{self.base}{index:08x}"


class PendingApply:
    """One sent :meth:`SweepWrites.start_apply` call, on a pool connection of its own until
    :meth:`result` reads the answer (call it exactly once, before the next batch's)."""

    def __init__(
        self, writes: SweepWrites, keys: list[str], args: list[str | int], base: str
    ) -> None:
        self._writes = writes
        self._keys = keys
        self._args = args
        self._base = base
        self._connection: Connection | None = None

    def send(self) -> None:
        client = self._writes.client
        with redis_errors(client):
            connection = client.connection_pool.get_connection()
            try:
                sha = self._writes.script.sha
                send: Any = connection.send_command  # untyped in redis-py
                send("EVALSHA", sha, len(self._keys), *self._keys, *self._args)
            except BaseException:
                self._drop(connection)
                raise
        self._connection = connection

    def result(self) -> AppliedBatch:
        connection, self._connection = self._connection, None
        if connection is None:  # nothing to send, or already read
            return AppliedBatch("", self._base)
        client = self._writes.client
        with redis_errors(client):
            try:
                reply = connection.read_response()
            except redis.exceptions.NoScriptError:
                # A Redis restart or SCRIPT FLUSH since the last load: the Script object
                # loads it and runs it (nothing ran: NOSCRIPT is refused before execution).
                client.connection_pool.release(connection)
                reply = self._writes.script(keys=self._keys, args=self._args)
            except BaseException:
                self._drop(connection)
                raise
            else:
                client.connection_pool.release(connection)
        return AppliedBatch(str(reply), self._base)

    def _drop(self, connection: Connection) -> None:
        # A half-written or half-read exchange: this connection's stream is not reusable.
        disconnect: Any = connection.disconnect  # untyped in redis-py
        disconnect()
        self._writes.client.connection_pool.release(connection)


class SweepWrites:
    """The sweep's scripts on one client (registering makes no round trip)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.script = client.register_script(script_source("sweep_apply"))
        self._fields = client.register_script(script_source("hash_fields"))
        self._lane_prefix = keys.lane("")

    def apply(self, claim_ms: int, now_ms: int, lines: Sequence[str]) -> AppliedBatch:
        """Re-score and tick one claimed batch. ``lines``: ``"<member>\\t<next ms>\\t<tick>"``
        per member, tick ``h`` (heartbeat), ``d`` (dream) or ``-`` (skipped: re-scored only).
        Members and lanes never contain a tab or newline (registry names forbid them)."""
        return self.start_apply(claim_ms, now_ms, lines).result()

    def start_apply(self, claim_ms: int, now_ms: int, lines: Sequence[str]) -> PendingApply:
        """:meth:`apply`, sent without waiting for the answer: the sweep prepares its next
        batch in Python while Redis runs this one (:meth:`PendingApply.result` waits)."""
        # Turn ids: uuid4 entropy per call (24 hex digits) + an 8-digit per-tick counter.
        base = uuid.uuid4().hex[:24]
        keys = [self.keys.schedule, self.keys.queued]
        args: list[str | int] = [claim_ms, now_ms, self._lane_prefix, base, "\n".join(lines)]
        pending = PendingApply(self, keys, args, base)
        if lines:
            pending.send()
        return pending

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

"""Repairing lanes: queue a dead-lettered lane again (``revive``), and re-queue lanes stranded
by a dead worker or a lost message (``reap``, beat's reaper pass). Each repair is its own script
that re-checks the lane, so a lane that moved on meanwhile is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import structlog

from workers import metrics
from workers.fleet.lane_store import LaneStore, new_turn_id
from workers.fleet.outcomes import Repair, TickOutcome
from workers.fleet.scripts import ScriptCall, redis_errors, run_scripts

__all__ = ["LaneRepairs"]

_log = structlog.get_logger("soulfleet.lanes")


class LaneRepairs(LaneStore):
    """The repair side of :class:`~workers.fleet.lanes.Lanes`."""

    def revive(
        self, lane: str, *, drop_kept: bool = False, reindex_only: bool = False
    ) -> TickOutcome:
        """Queue a dead-lettered lane again with attempts reset (its kept items run first;
        with ``drop_kept``, the items the dead turn held are dropped instead: a message the
        provider refuses for good would kill the lane again).

        A lane queued but missing from the queued index (a Redis that evicted keys) is put back
        and its turn queued again (outcome ``queued``, its own turn id). A lane waiting out a
        retry backoff is queued now (kind ``retry_now``: the provider is back before its
        Retry-After said). A running or deferred lane missing from that index is put back in it
        (kind ``reindexed_running``/``reindexed_deferred``, outcome ``coalesced``: the reaper or
        the breaker's resume takes it on). Any other lane that is not dead is left alone:
        outcome ``coalesced``, no turn id. ``reindex_only`` (`revive --all`'s repair of lanes
        lost from their index) does only that: a retrying lane goes back into lanes:retry at
        its retry_at (kind ``reindexed_retry``), and no dead lane is revived.
        """
        turn_id = new_turn_id()
        keys = [*self.keys.lane_keys(lane), self.keys.retry]
        with redis_errors(self.client):
            provider = str(self.client.hget(self.keys.lane(lane), "provider") or "")
            if provider:  # where a deferred lane is indexed (keys a script must be given)
                keys += [self.keys.deferred(provider), self.keys.breakers]
            args: list[str | int] = [lane, self._now_ms(), turn_id, "1" if drop_kept else "0",
                                     provider, "1" if reindex_only else "0"]  # fmt: skip
            reply = self.scripts.revive(keys=keys, args=args)
        if reply[0] == "reindexed":
            _log.warning("lane.reindexed", lane=lane, state=str(reply[1]),
                         why="missing from its index (evicted keys?)")  # fmt: skip
            return TickOutcome(lane, f"reindexed_{reply[1]}", "coalesced")
        if reply[0] == "retried":
            _log.info("lane.retried_now", lane=lane, turn_id=str(reply[1]))
            return TickOutcome(
                lane, "retry_now", "queued", str(reply[1]), str(reply[2]), int(reply[3])
            )
        if reply[0] == "requeued":
            why = "queued but missing from the queued index (evicted keys?)"
            _log.warning("lane.requeued", lane=lane, turn_id=str(reply[1]), why=why)
            return TickOutcome(lane, "revive", "queued", str(reply[1]), str(reply[2]))
        if reply[0] != "queued":
            return TickOutcome(lane, "revive", "coalesced")
        dropped = int(reply[3])
        # Info, not warning: whoever revives (the CLI) reports it, dropped items included; a
        # warning printed a raw log line into `revive --drop-kept`'s own output.
        _log.info("lane.revived", lane=lane, turn_id=turn_id, items_dropped=dropped)
        return TickOutcome(lane, "revive", "queued", str(reply[1]), str(reply[2]), dropped)

    def forget(self, lane: str) -> int | None:
        """Remove dead-lettered ``lane`` and the items it kept (``forget.lua``): for a lane
        whose persona is gone. Returns how many items were dropped; None when the lane is not
        dead (nothing changed)."""
        with redis_errors(self.client):
            reply = self.scripts.forget(keys=self.keys.lane_keys(lane), args=[lane])
        if reply[0] != "forgotten":
            return None
        _log.info("lane.forgotten", lane=lane, items_dropped=int(reply[1]))
        return int(reply[1])

    def unsent(self, turns: Sequence[tuple[str, str]], error: str) -> int:
        """Hand ``(lane, turn id)`` turns whose wake-up could not be published to the reaper's
        next pass (see ``unsent.lua``) instead of its 600 s wait for a lost message. Never
        raises (the caller is already handling the publish failure); returns how many were
        marked. Logged as ``turn.unsent`` per lane, with ``error``."""
        calls = [
            ScriptCall(self.scripts.unsent, self.keys.lane_keys(lane), [lane, turn_id])
            for lane, turn_id in turns
        ]
        try:
            replies = run_scripts(self.client, calls, isolated=True)
        except Exception as exc:  # Redis is the trouble too: the 600 s reaper path remains
            _log.error("turn.unsent_not_marked", lanes=len(turns), error=str(exc))
            return 0
        marked = 0
        for (lane, turn_id), reply in zip(turns, replies, strict=True):
            if isinstance(reply, Exception):
                _log.error("turn.unsent_not_marked", lane=lane, turn_id=turn_id, error=str(reply))
            elif reply == 1:
                marked += 1
                _log.warning(
                    "turn.unsent", lane=lane, turn_id=turn_id, error=error,
                    hint="its wake-up is sent again by beat's next reaper pass "
                    "(SOULFLEET_REAP_INTERVAL), if a beat sweeps under this key prefix "
                    "(`soulfleet status` shows its last sweep)",
                )  # fmt: skip
        return marked

    def reap(self, *, queued_after: float, limit: int = 1000) -> list[Repair]:
        """Re-queue lanes stranded by a dead worker or a lost message (the caller publishes).

        Candidates come from the ``lanes:running`` / ``lanes:queued`` indexes; each repair is
        re-checked by its own script, so a lane that moved on meanwhile is left alone.
        """
        now = self._now_ms()
        with redis_errors(self.client):
            stale = now - self._ms(queued_after)
            running: list[str] = self.client.zrangebyscore(
                self.keys.running, "-inf", f"({now}", 0, limit
            )  # type: ignore[assignment]
            queued: list[str] = self.client.zrangebyscore(
                self.keys.queued, "-inf", f"({stale}", 0, limit
            )  # type: ignore[assignment]
        calls = [
            ScriptCall(
                self.scripts.reap_running, self.keys.lane_keys(lane), [lane, now, new_turn_id()]
            )
            for lane in running
        ]
        after = self._ms(queued_after)
        calls += [
            ScriptCall(self.scripts.reap_queued, self.keys.lane_keys(lane), [lane, now, after])
            for lane in queued
        ]
        # Isolated: one lane whose keys are broken must not stop the repair of every other.
        replies = run_scripts(self.client, calls, isolated=True)
        repairs: list[Repair] = []
        reasons: list[Literal["lease_expired", "queued_too_long", "unsent"]] = []
        reasons += ["lease_expired"] * len(running)
        reasons += ["queued_too_long"] * len(queued)
        for lane, found, reply in zip([*running, *queued], reasons, replies, strict=True):
            if isinstance(reply, Exception):
                _log.error("lane.reap_failed", lane=lane, reason=found, error=str(reply))
                continue
            if reply[0] == "repaired":
                # A refused wake-up sent again is not a lost message.
                reason = "unsent" if len(reply) > 3 and reply[3] == "unsent" else found
                repairs.append(Repair(lane, reason, str(reply[1]), str(reply[2])))
                metrics.REAPER_REPAIRS.labels(reason=reason).inc()
                _log.warning("lane.reaped", lane=lane, reason=reason, turn_id=reply[1])
        return repairs

"""Holding a lane: the claim a worker takes when a turn message reaches it (``receive.lua``),
and the lease a started turn keeps renewing (``renew.lua``, ``holds.lua``). A claim that lapses
unstarted, or a lease that lapses mid-turn, hands the lane to recovery; a fence that moved on
means the holder lost the lane.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.fleet.lane_store import LaneStore
from workers.fleet.scripts import ScriptCall, redis_errors, run_scripts

__all__ = ["LaneHolds"]


class LaneHolds(LaneStore):
    """The claim and lease side of :class:`~workers.fleet.lanes.Lanes`."""

    def receive(self, lane: str, turn_id: str, worker: str, *, ttl: float) -> bool:
        """Claim the lane's queued turn for ``worker`` on message receipt (``receive.lua``);
        False for a duplicate or stale message. The claim lives ``ttl`` unless renewed."""
        keys = [self.keys.lane(lane), self.keys.claim(lane), self.keys.claimed]
        args: list[str | int] = [lane, turn_id, worker, self._now_ms(), self._ms(ttl)]
        with redis_errors(self.client):
            return bool(self.scripts.receive(keys=keys, args=args))

    def unclaim(self, lane: str, turn_id: str, worker: str) -> bool:
        """Drop ``worker``'s claim on ``lane``'s turn ``turn_id`` (``unclaim.lua``), once the
        message it claimed for is published; False when the claim is no longer its own (the
        worker that took the message claimed it meanwhile, or it lapsed)."""
        keys = [self.keys.claim(lane), self.keys.claimed]
        with redis_errors(self.client):
            return bool(self.scripts.unclaim(keys=keys, args=[lane, f"{worker}|{turn_id}"]))

    def renew_claims(self, claims: Sequence[tuple[str, str]], *, ttl: float) -> list[bool]:
        """Extend the receive claims ``(lane, turn id)`` while each is still that turn's
        (``renew_claim.lua``, one round trip); False = gone, or another turn's claim now."""
        if not claims:
            return []
        ms = self._ms(ttl)
        replies = run_scripts(
            self.client,
            [
                ScriptCall(self.scripts.renew_claim, [self.keys.claim(lane)], [turn_id, ms])
                for lane, turn_id in claims
            ],
        )
        return [bool(ok) for ok in replies]

    def renew(self, lane: str, fence: int) -> bool:
        """Extend the lease if ``fence`` is still current; False means the lease is lost."""
        return self.renew_many([(lane, fence)])[0]

    def renew_many(self, leases: Sequence[tuple[str, int]]) -> list[bool]:
        """:meth:`renew` for many ``(lane, fence)`` pairs in one round trip (the Renewer's)."""
        if not leases:
            return []
        now, ttl = self._now_ms(), self._ms(self.lease_ttl)
        replies = run_scripts(
            self.client,
            [
                ScriptCall(self.scripts.renew, self.keys.lane_keys(lane), [lane, fence, now, ttl])
                for lane, fence in leases
            ],
        )
        return [bool(ok) for ok in replies]

    def holds(self, lane: str, fence: int) -> bool:
        """Ask Redis whether ``fence`` still owns the lane with a live lease."""
        with redis_errors(self.client):
            return bool(self.scripts.holds(keys=self.keys.lane_keys(lane), args=[lane, fence]))

"""Reading lanes for people and for the turn: a lane's status snapshot, how many lanes are
queued, running, dead, backing off or deferred, the session pointer, and the work id a turn's
start reply gives (:func:`work_id`). Reads only: no script, no write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workers.fleet.lane_store import LaneStore
from workers.fleet.scripts import redis_errors
from workers.persona.session import Pointer

#: Lanes read per pipelined round trip by :meth:`LaneReports.status_many` (bounds the reply
#: Redis buffers for one client, whatever the fleet's size).
STATUS_BATCH = 1000

__all__ = ["LaneReports", "work_id"]


def work_id(lane: str, commits: int, born_ms: int) -> str:
    """The id of the work a lane's current turn does: ``<lane>:<born>:<committed turns>`` (the
    turn's start returns both numbers).

    It stays the same across every failed or crashed attempt at that work (only a commit
    moves it on), so the holder of the lane's fence can key side effects with it: a retried
    attempt repeating its predecessor's memory write is recognised and not applied twice.
    ``born_ms`` (when the lane's Redis state was created) keeps ids unique when that state is
    lost (a Redis without its AOF, a flushed database): the commit count starts from 0 again,
    and without it the first turns after would find their writes "already applied" in the
    persona's ledger and silently skip them.
    """
    return f"{lane}:{born_ms}:{commits}"


class LaneReports(LaneStore):
    """The read side of :class:`~workers.fleet.lanes.Lanes`."""

    def status(self, lane: str) -> dict[str, object]:
        """A snapshot of the lane for people (the CLI, ``Fleet.status``), in one round trip.

        Not a MULTI block: a full Redis (noeviction at maxmemory) refuses every command queued
        in MULTI, reads included, and ``status`` is what an operator runs to see why the fleet
        stopped. The four reads may straddle a change (an item drained between the hash and
        the inbox length); the next call shows the settled state."""
        return self.status_many([lane])[0]

    def status_many(self, lanes: Sequence[str]) -> list[dict[str, object]]:
        """:meth:`status` of many lanes, :data:`STATUS_BATCH` lanes per round trip
        (``soulfleet status`` of a fleet: it took four round trips per lane)."""
        replies: list[Any] = []
        with redis_errors(self.client):
            for start in range(0, len(lanes), STATUS_BATCH):
                pipe = self.client.pipeline(transaction=False)
                for lane in lanes[start : start + STATUS_BATCH]:
                    pipe.hgetall(self.keys.lane(lane))
                    pipe.llen(self.keys.inbox(lane))
                    pipe.llen(self.keys.inflight(lane))
                    pipe.pttl(self.keys.lease(lane))
                replies += pipe.execute()
        return [_snapshot(*replies[i : i + 4]) for i in range(0, len(replies), 4)]

    def counts(self) -> dict[str, int]:
        """How many lanes are queued, running and dead-lettered (three ZCARDs)."""
        with redis_errors(self.client):
            pipe = self.client.pipeline(transaction=False)
            pipe.zcard(self.keys.queued)
            pipe.zcard(self.keys.running)
            pipe.zcard(self.keys.dead)
            queued, running, dead = pipe.execute()
        return {"queued": int(queued), "running": int(running), "dead": int(dead)}

    def unindexed(self, lanes: Sequence[tuple[str, str, str]]) -> list[str]:
        """Of ``lanes`` (``(lane, state, provider)`` as their hashes read), those missing from
        the index their state is kept in (queued, running, retry, or the provider's deferred
        set, the provider listed in breakers): a Redis that evicted keys (or a hand that
        deleted them) left them where no reaper, release or resume pass looks, for ever;
        :meth:`revive` puts one back."""
        indexes = {"queued": self.keys.queued, "running": self.keys.running,
                   "retry": self.keys.retry}  # fmt: skip
        checked = [
            (lane, state, provider)
            for lane, state, provider in lanes
            if state in indexes or (state == "deferred" and provider)
        ]
        if not checked:
            return []
        with redis_errors(self.client):
            pipe = self.client.pipeline(transaction=False)
            for lane, state, provider in checked:
                pipe.zscore(indexes.get(state) or self.keys.deferred(provider), lane)
                if state == "deferred":  # recovery finds its provider through breakers only
                    pipe.sismember(self.keys.breakers, provider)
            replies = iter(pipe.execute())
        lost = []
        for lane, state, provider in checked:
            indexed = next(replies) is not None
            if state == "deferred":
                indexed = bool(next(replies)) and indexed
            if not indexed:
                lost.append((lane, provider))
        return self._still_unindexed(lost) if lost else []

    def _still_unindexed(self, lanes: Sequence[tuple[str, str]]) -> list[str]:
        """Of ``lanes`` found missing from their index, those still missing when their state
        and every index it could be kept in are read again side by side: a turn that started
        or ended between the caller's read of a lane and the check above moved it to another
        index, and a healthy lane was named LOST (an operator paged for nothing). A plain
        pipeline, not MULTI: a full Redis refuses reads queued in MULTI, when status is most
        needed; its few commands run back to back, with no script between them."""
        indexes = {"queued": 0, "running": 1, "retry": 2}
        with redis_errors(self.client):
            pipe = self.client.pipeline(transaction=False)
            for lane, provider in lanes:
                pipe.hmget(self.keys.lane(lane), ["state", "provider"])
                pipe.zscore(self.keys.queued, lane)
                pipe.zscore(self.keys.running, lane)
                pipe.zscore(self.keys.retry, lane)
                pipe.zscore(self.keys.deferred(provider or "-"), lane)
                pipe.sismember(self.keys.breakers, provider or "-")
            replies = pipe.execute()
        lost = []
        for n, (lane, provider) in enumerate(lanes):
            (state, now_provider), *scores, deferred, listed = replies[n * 6 : n * 6 + 6]
            if state in indexes:
                missing = scores[indexes[state]] is None
            elif state == "deferred" and provider and now_provider == provider:
                missing = deferred is None or not listed
            else:
                missing = False  # idle, dead, or deferred under another provider meanwhile
            if missing:
                lost.append(lane)
        return lost

    def waiting(self) -> dict[str, int]:
        """How many lanes wait out a backoff (``retry``) or an open provider breaker
        (``deferred``)."""
        with redis_errors(self.client):
            providers = sorted(str(p) for p in self.client.smembers(self.keys.breakers))
            pipe = self.client.pipeline(transaction=False)
            pipe.zcard(self.keys.retry)
            for provider in providers:
                pipe.zcard(self.keys.deferred(provider))
            retry, *deferred = pipe.execute()
        return {"retry": int(retry), "deferred": sum(int(n) for n in deferred)}

    def session_pointer(self, lane: str) -> Pointer:
        """Which session state is current for the lane, and its reset epoch."""
        with redis_errors(self.client):
            state, epoch = self.client.hmget(self.keys.lane(lane), ["session", "session_epoch"])
        return Pointer(str(state) if state else None, int(epoch or 0))


def _snapshot(
    fields: dict[str, str], inbox_depth: int, inflight: int, lease_ms: int
) -> dict[str, object]:
    """One lane's status from its hash, inbox and in-flight lengths and lease PTTL."""

    def num(name: str) -> int:
        return int(fields.get(name) or 0)

    def when(name: str) -> float | None:
        value = fields.get(name)
        return int(value) / 1000 if value else None

    return {
        "state": fields.get("state", "idle"),
        "pending_ticks": num("ticks"),
        "inbox_depth": int(inbox_depth),
        "inflight_items": int(inflight),
        "inflight_ticks": num("inflight_ticks"),
        "turn_id": fields.get("turn_id"),
        "kind": fields.get("kind"),
        "queued_at": when("queued_at"),
        "started_at": when("started_at"),
        "worker": fields.get("worker"),
        # Seconds the running turn's lease has left (None: no lease): a live worker renews
        # it every SOULFLEET_LEASE_TTL / 3, so it only runs low when the worker went quiet.
        "lease_left": int(lease_ms) / 1000 if int(lease_ms) >= 0 else None,
        "fence": num("fence"),
        "attempts": num("attempts"),
        "last_turn": fields.get("last_turn"),
        "last_status": fields.get("last_status"),
        "last_text": fields.get("last_text"),
        "last_end": when("last_end"),
        "last_note": fields.get("last_note"),
        "last_error": fields.get("last_error"),
        "last_error_at": when("last_error_at"),
        "last_error_kind": fields.get("last_error_kind"),
        "failing_since": when("failing_since"),
        "failures": num("failures"),
        "retry_at": when("retry_at"),
        "provider": fields.get("provider"),
    }

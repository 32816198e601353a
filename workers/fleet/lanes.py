"""Lanes: one persona's turn sequence, kept in Redis, changed only by one Lua script per step.

A lane (``ava``, ``ava-dreamer``) runs one turn at a time. Its state machine::

    idle ──post(wake)/tick──▶ queued ──start──▶ running ──finish──▶ idle  (or queued: follow-up)
                                 ▲                │ fail / crash
                                 └── retry ◀──────┤
                                        dead ◀────┘ after max_attempts in a row ── revive ─▶ queued

Why it is built this way:

- Every transition is ONE script (``workers/fleet/lua/<name>.lua``): the checks and the writes of a
  step are atomic, so no interleaving of workers, beats and posters can put two turns of one
  lane in flight or lose an item. Python only prepares arguments and reads replies.
- The clock is Python's: time goes in as ARGV (ms), so tests drive it with a VirtualClock.
  Turn ids are made here too (Lua has no good randomness); a script uses one only if it queues.
- A start takes a lease (``<fence>:<worker>``, PX ttl) and bumps the lane's fence; finish and
  fail check the fence, so a worker whose lease lapsed (and whose lane was taken over) can
  never commit. Drained items stay in the in-flight list until finish, so a crashed turn's
  items are the first thing the next start hands out.
- Publishing turn messages is not done here: an outcome's ``turn_id`` is set exactly when a
  turn was queued and the caller must publish it. The outcome values live in
  :mod:`workers.fleet.outcomes` (re-exported here) so their readers need not import the lanes.
- One class, several rooms: the transitions of a turn's life are here; ticks are
  :mod:`~workers.fleet.lane_ticks`, claims and leases :mod:`~workers.fleet.lane_holds`, reads
  :mod:`~workers.fleet.lane_reports`, repairs :mod:`~workers.fleet.lane_repairs`.

Every method may raise :class:`~workers.fleet.errors.RedisUnavailable`.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import redis
import structlog

from workers.fleet.errors import InboxFull, ItemTooLarge, LeaseLost
from workers.fleet.lane_holds import LaneHolds
from workers.fleet.lane_repairs import LaneRepairs
from workers.fleet.lane_reports import LaneReports, work_id
from workers.fleet.lane_store import new_turn_id
from workers.fleet.lane_ticks import TICK_KINDS, LaneTicks
from workers.fleet.outcomes import (
    FailOutcome,
    FinishOutcome,
    PostOutcome,
    Repair,
    StartOutcome,
    TickOutcome,
)
from workers.fleet.scripts import redis_errors
from workers.logs import Throttle
from workers.persona.errors import FailureKind
from workers.persona.inbox import InboxItem
from workers.persona.session import Pointer
from workers.persona.spend import pass_times

__all__ = [
    "LAST_TEXT_MAX",
    "TICK_KINDS",
    "FailOutcome",
    "FinishOutcome",
    "Lanes",
    "PostOutcome",
    "Repair",
    "SessionCommit",
    "StartOutcome",
    "TickOutcome",
    "work_id",
]

_log = structlog.get_logger("soulfleet.lanes")
#: Refused posts are counted in Redis (Keys.inbox_rejects; beat exports
#: soulfleet_inbox_rejects_total); logged once a minute per lane.
_INBOX_FULL_LOGS = Throttle()

LAST_TEXT_MAX = 2000
_ERROR_MAX = 4000


def _cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` UTF-8 bytes (notice included): what keeps the beats stream
    bounded in bytes (SOULFLEET_BEATS_MAX entries of at most SOULFLEET_BEAT_MAX_BYTES each)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    notice = f"… [beat cut at {limit} bytes of {len(data)}; the transcript has it all]"
    room = max(0, limit - len(notice.encode("utf-8")))
    return data[:room].decode("utf-8", errors="ignore") + notice


def _open_object(document: Mapping[str, object]) -> str:
    """``document`` as JSON without its closing brace, for finish.lua to append the turn id."""
    return json.dumps(document, separators=(",", ":"))[:-1]  # the callers' are never empty


@dataclass(frozen=True, slots=True)
class SessionCommit:
    """A turn's session write, for :meth:`Lanes.finish`: make ``state`` current if the lane's
    pointer is still ``base``."""

    base: Pointer
    state: str


def _item(raw: str) -> InboxItem:
    try:
        return InboxItem.from_json(raw)
    except ValueError as exc:
        # Never drop: hand the raw text to the turn as an untrusted item instead.
        _log.warning("lanes.item_unparseable", error=str(exc))
        return InboxItem(
            text=raw, sender="unknown", channel="unparseable", id="", at=0.0, trusted=False
        )


class Lanes(LaneReports, LaneRepairs, LaneTicks, LaneHolds):
    """Every lane transition of one fleet (and its reads and repairs). Thread-safe; share one
    per process."""

    # -- inbound ----------------------------------------------------------------------------
    def post(
        self, lane: str, item: InboxItem, *, wake: bool, new_session: bool = False
    ) -> PostOutcome:
        """Append ``item`` to the lane's inbox; with ``wake``, queue a turn if the lane is idle;
        with ``new_session``, end the lane's session (:meth:`reset_session`) in the same step,
        only if the item is accepted.

        Raises :class:`ItemTooLarge` (before touching Redis) or :class:`InboxFull`; in both
        cases the item was not written. An InboxFull with ``drain_turn`` queued that turn on
        the idle lane (wake asked): the caller publishes it, as a queued post's turn.
        """
        raw = item.to_json()
        size = len(raw.encode("utf-8"))
        if size > self.item_max_bytes:
            raise ItemTooLarge(lane, size, self.item_max_bytes, item.text_room(self.item_max_bytes))
        turn_id = new_turn_id()
        args = [lane, raw, "1" if wake else "0", self.inbox_max, self._now_ms(), turn_id,
                "1" if new_session else "0"]  # fmt: skip
        with redis_errors(self.client):
            reply = self.scripts.post(keys=self.keys.lane_keys(lane), args=args)
        outcome, depth = str(reply[0]), int(reply[1])
        if outcome == "full":
            with contextlib.suppress(redis.RedisError):  # a count: never the caller's error
                self.client.incr(self.keys.inbox_rejects)
            held_back = _INBOX_FULL_LOGS.allow(lane)
            if held_back is not None:  # a caller posting in a loop: a line a minute per lane
                _log.warning("lane.inbox_full", lane=lane, limit=self.inbox_max,
                             refused_before=held_back)  # fmt: skip
            drain = str(reply[2]) if len(reply) > 2 and reply[2] else None
            state = str(reply[3]) if len(reply) > 3 else ""
            raise InboxFull(lane, self.inbox_max, drain_turn=drain, state=state)
        if outcome == "queued":
            return PostOutcome(lane, "queued", item.id, depth, turn_id, "interactive")
        return PostOutcome(lane, "dead" if outcome == "dead" else "pending", item.id, depth)

    # -- a turn's life ----------------------------------------------------------------------
    def start(self, lane: str, turn_id: str, worker: str) -> StartOutcome:
        """Begin turn ``turn_id``: take the lease and drain inbox + ticks into in-flight.

        ``duplicate`` (its turn is running under a live lease), ``stale`` (not the lane's
        current turn) and ``dead`` (dead-lettered, possibly by this very start) mean: drop the
        message, run nothing.
        """
        args: list[str | int] = [
            lane, turn_id, worker, self._now_ms(), self._ms(self.lease_ttl), self.max_attempts,
            self.drain_max_bytes,
        ]  # fmt: skip
        keys = [*self.keys.lane_keys(lane), self.keys.claim(lane), self.keys.claimed]
        with redis_errors(self.client):
            reply = self.scripts.start(keys=keys, args=args)
        status = str(reply[0])
        if status == "dead":
            return StartOutcome("dead", error=str(reply[1]))
        if status != "started":
            return StartOutcome(cast(Literal["duplicate", "stale"], status))
        fence, attempt, kind, ticks, recovered, commits, session, epoch, last_pass, born = reply[
            1:11
        ]
        failing = str(reply[11] or "")
        since = str(reply[12] or "")
        times = pass_times(last_pass)
        return StartOutcome(
            "started",
            fence=int(fence),
            items=[_item(raw) for raw in reply[13:]],
            ticks=int(ticks),
            recovered=int(recovered),
            attempt=int(attempt),
            kind=str(kind),
            commits=int(commits or 0),
            session=str(session) if session else None,
            session_epoch=int(epoch or 0),
            last_pass_ms=None if times is None else round(times[0] * 1000),
            last_pass_began_ms=None if times is None else round(times[1] * 1000),
            born_ms=int(born),
            error=failing,
            failing_since_ms=int(since) if since.isdigit() else None,
        )

    def finish(
        self,
        lane: str,
        fence: int,
        *,
        status: str,
        text: str,
        beat: Mapping[str, object] | None = None,
        reply_ids: Sequence[str] = (),
        reply_extra: Mapping[str, object] | None = None,
        session: SessionCommit | None = None,
        publisher: str = "",
        claim_ttl: float = 0.0,
        note: str = "",
    ) -> FinishOutcome:
        """Commit the turn holding ``fence``; raise :class:`LeaseLost` (changing nothing) if
        it no longer holds the lane.

        ``beat`` (e.g. ``{"persona": "ava", "text": reply}``) is added to the beats stream in
        the same atomic step, with ``time`` defaulting to now and ``turn_id`` from the lane;
        each of its values is cut to ``beat_max_bytes``, so the stream is bounded in bytes.
        Each ``reply_ids`` item gets ``{text, status, turn_id, **reply_extra}`` (e.g. usage,
        limit) on its reply list. ``session`` makes the turn's session state current in the same
        step, if the lane's pointer is still the one the turn started from (a reset during the
        turn wins: outcome ``session="conflict"``).

        ``publisher`` (with ``claim_ttl``) is who publishes a follow-up this commit queues: the
        lane is claimed for it, as on receipt, so beat re-publishes the turn if the publisher
        dies before it is out; it calls :meth:`unclaim` once it is. "" takes no claim.

        ``note`` (cut to ``LAST_TEXT_MAX``) is kept as the lane's ``last_note`` until a turn
        ends without one: why the turn ended short, for ``soulfleet status``.
        """
        beat_args: list[str] = []
        if beat is not None:
            fields = {"persona": lane, "time": repr(self.clock.time()), **beat}
            fields.pop("turn_id", None)
            for name, value in fields.items():
                beat_args += [name, _cut(str(value), self.beat_max_bytes)]
        keys = [*self.keys.lane_keys(lane), self.keys.beats]
        keys += [self.keys.claim(lane), self.keys.claimed]
        keys += [self.keys.reply(item_id) for item_id in reply_ids]
        follow_up = new_turn_id()
        args: list[str | int] = [
            lane, fence, self._now_ms(), status,
            _open_object({**(reply_extra or {}), "text": text, "status": status}),
            text[:LAST_TEXT_MAX], follow_up,
            self.beats_max, self._ms(self.reply_ttl), len(beat_args), *beat_args,
        ]  # fmt: skip
        if session is not None:
            args += [session.base.state or "", session.base.epoch, session.state]
        else:
            args += ["", 0, ""]
        args += [publisher, self._ms(claim_ttl), note[:LAST_TEXT_MAX]]
        with redis_errors(self.client):
            reply = self.scripts.finish(keys=keys, args=args)
        if reply[0] == "lost":
            raise LeaseLost(lane, fence, _lost("finish", reply))
        beat_id = str(reply[2]) or None
        outcome = str(reply[3])
        if reply[0] == "queued":
            return FinishOutcome(str(reply[1]), str(reply[4]), str(reply[5]), beat_id, outcome)
        return FinishOutcome(str(reply[1]), beat_id=beat_id, session=outcome)

    # -- sessions ---------------------------------------------------------------------------
    def reset_session(self, lane: str) -> int:
        """End the lane's session: its next turn starts a new one (a turn running now still
        finishes, but its session write is dropped). Returns the new epoch."""
        with redis_errors(self.client):
            return int(self.client.hincrby(self.keys.lane(lane), "session_epoch", 1))

    def fail(
        self,
        lane: str,
        fence: int,
        *,
        error: str,
        kind: FailureKind = "unknown",
        backoff: tuple[float, float] = (0.0, 0.0),
        retry_for: float = 6 * 3600.0,
        jitter: float | None = None,
        publisher: str = "",
        claim_ttl: float = 0.0,
        wait_at_least: float = 0.0,
    ) -> FailOutcome:
        """Record a failed turn of ``kind``; dead-letter the lane (``fail.lua`` says when, by
        kind), or retry it after a full-jitter exponential ``backoff`` of ``(base, cap)``
        seconds, and no sooner than ``wait_at_least`` (a provider's Retry-After): in
        ``lanes:retry`` (beat releases it), or queued now (publish ``retry_turn_id``) when the
        delay comes out 0, as it always does with base 0 and no least wait. A retry queued now
        is claimed for ``publisher`` as :meth:`finish` claims a follow-up.

        Raises :class:`LeaseLost` (changing nothing) if ``fence`` no longer holds the lane.
        """
        retry = new_turn_id()
        base, cap = backoff
        draw = random.random() if jitter is None else jitter
        args: list[str | int] = [
            lane, fence, self._now_ms(), error[:_ERROR_MAX], retry, self.max_attempts, kind,
            int(base * 1000), int(cap * 1000), repr(draw), self._ms(retry_for),
            publisher, self._ms(claim_ttl), int(wait_at_least * 1000),
        ]  # fmt: skip
        keys = [*self.keys.lane_keys(lane), self.keys.retry, self.keys.claim(lane)]
        keys.append(self.keys.claimed)
        with redis_errors(self.client):
            reply = self.scripts.fail(keys=keys, args=args)
        if reply[0] == "lost":
            raise LeaseLost(lane, fence, _lost("fail", reply))
        if reply[0] == "dead":
            _log.error("lane.dead_lettered", lane=lane, failure=kind, error=str(reply[3])[:300])
            return FailOutcome(
                dead=True, retry_turn_id=None, kind=str(reply[2]), reason=str(reply[3])
            )
        if reply[0] == "retry":
            return FailOutcome(
                dead=False, retry_turn_id=None, kind=str(reply[2]), retry_at=int(reply[4]) / 1000
            )
        return FailOutcome(dead=False, retry_turn_id=str(reply[3]), kind=str(reply[2]))

    def defer(self, lane: str, fence: int, *, provider: str, why: str) -> str:
        """Park the started turn while ``provider``'s breaker is open (``defer.lua``): no
        attempt spent; beat queues it again when the breaker closes. Returns its turn id.

        Raises :class:`LeaseLost` (changing nothing) if ``fence`` no longer holds the lane.
        """
        turn_id = new_turn_id()
        keys = [*self.keys.lane_keys(lane), self.keys.deferred(provider), self.keys.breakers]
        args: list[str | int] = [lane, fence, self._now_ms(), provider, turn_id, why[:_ERROR_MAX]]
        with redis_errors(self.client):
            reply = self.scripts.defer(keys=keys, args=args)
        if reply[0] == "lost":
            raise LeaseLost(lane, fence, _lost("defer", reply))
        return turn_id


def _lost(verb: str, reply: Sequence[Any]) -> str:
    """Why a turn's ``verb`` was refused by its lane's fence check (the script's reply)."""
    state = str(reply[1]) if len(reply) > 1 else "?"
    if not state:
        return (
            f"{verb} refused: the lane's state is gone from Redis (it lost its data, a restart "
            "without its AOF or FLUSHALL, or evicted keys): the turn has nothing to commit to"
        )
    return f"{verb} refused: the fence is no longer current (the lane is {state} now)"

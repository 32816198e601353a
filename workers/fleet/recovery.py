"""Recovery: what beat moves along every second so a lane never waits longer than it must.

Three kinds of waiting lane, each in its own Redis index, each released by one Lua script:

- ``lanes:retry``: a turn failed with a transient (or unknown) cause and waits out its backoff
  (:class:`Backoff`: exponential with full jitter, from ``SOULFLEET_RETRY_BASE`` up to
  ``SOULFLEET_RETRY_MAX``). ``release.lua`` queues it once ``retry_at`` has passed. The wait is
  a score in Redis, never a sleep in a worker thread: a worker is free for other lanes
  meanwhile, and a worker that dies loses nothing.
- ``lanes:claimed``: a worker took a turn message and claimed the lane (``receive.lua``), then
  died before start. Its claim key lapses ``SOULFLEET_CLAIM_TTL`` after its last renewal and
  ``reap_claimed.lua`` re-publishes the same turn: a lost message costs seconds, not
  ``SOULFLEET_REAP_QUEUED_AFTER``. Chosen over tracking delivery in the broker because kombu's
  Redis transport does not record which worker holds an unacked message, and because a queued
  lane whose message simply waits behind a backlog must NOT be re-published: only a claim
  tells "a worker had it" from "no worker has got to it yet", and only the claimed few are
  scanned (``lanes:claimed`` holds one entry per message in a worker's hands).
- ``deferred:<provider>``: turns parked by an open provider breaker (:mod:`workers.fleet.breaker`).
  When the breaker closes, every one is queued again; while it is open and a probe is due, one
  is queued to carry the probe call.

Every release re-checks the lane in its script, so a lane that moved on is left alone; the
caller publishes what was released (start drops duplicates and stale turn ids).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast

import structlog

from workers import metrics
from workers.fleet.breaker import Breaker
from workers.fleet.lanes import Lanes
from workers.fleet.outcomes import Repair
from workers.fleet.scripts import ScriptCall, redis_errors, run_scripts

__all__ = ["Backoff", "Recovery"]

_log = structlog.get_logger("soulfleet.recovery")

Reason = Literal["claim_lapsed", "retry_due", "resumed"]


def _names(reply: object) -> list[str]:
    return [str(name) for name in cast(Iterable[object], reply)]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: ``uniform(0, min(cap, base * 2**failures))``.

    Full jitter (not "equal"): after an outage thousands of lanes fail within one second, and
    spreading their retries over the whole step is what keeps them from returning together.
    """

    base: float
    cap: float

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        step = min(self.cap, self.base * (2.0 ** min(max(failures, 0), 40)))
        return (rng or random).uniform(0.0, step)


class Recovery:
    """Releases waiting lanes of one fleet; the caller publishes the returned repairs."""

    def __init__(self, lanes: Lanes, breaker: Breaker, *, claim_ttl: float) -> None:
        self.lanes = lanes
        self.breaker = breaker
        self.claim_ttl = claim_ttl

    def run(self, limit: int = 1000) -> list[Repair]:
        """One pass: due retries, lapsed claims, deferred lanes (up to ``limit`` each)."""
        return [*self.release_due(limit), *self.reap_claims(limit), *self.resume_deferred(limit)]

    def release_due(self, limit: int = 1000) -> list[Repair]:
        lanes, keys = self.lanes, self.lanes.keys
        now = lanes._now_ms()
        with redis_errors(lanes.client):
            due = _names(lanes.client.zrangebyscore(keys.retry, "-inf", now, 0, limit))
        calls = [
            ScriptCall(
                lanes.scripts.release, [*keys.lane_keys(lane), keys.retry], [lane, now, "retry"]
            )
            for lane in due
        ]
        return self._repairs(due, run_scripts(lanes.client, calls), "retry_due")

    def reap_claims(self, limit: int = 1000) -> list[Repair]:
        lanes, keys = self.lanes, self.lanes.keys
        now = lanes._now_ms()
        # A claim younger than its TTL is alive whatever happened: look only at older ones.
        before = now - int(self.claim_ttl * 1000)
        with redis_errors(lanes.client):
            old = _names(lanes.client.zrangebyscore(keys.claimed, "-inf", before, 0, limit))
        calls = [
            ScriptCall(
                lanes.scripts.reap_claimed,
                [keys.lane(lane), keys.claim(lane), keys.claimed, keys.queued],
                [lane, now],
            )
            for lane in old
        ]
        return self._repairs(old, run_scripts(lanes.client, calls), "claim_lapsed")

    def resume_deferred(self, limit: int = 1000) -> list[Repair]:
        lanes, keys = self.lanes, self.lanes.keys
        repairs: list[Repair] = []
        for state in self.breaker.states():
            if state.deferred == 0:
                continue
            if state.open:
                probe_due = (state.probe_at or 0) <= lanes.clock.time() and not state.probing
                if not probe_due:
                    continue
                count = 1  # one lane carries the probe; the rest wait for its verdict
            else:
                count = limit
            waiting = keys.deferred(state.provider)
            with redis_errors(lanes.client):
                parked = _names(lanes.client.zrange(waiting, 0, count - 1))
            now = lanes._now_ms()
            calls = [
                ScriptCall(
                    lanes.scripts.release, [*keys.lane_keys(lane), waiting], [lane, now, "deferred"]
                )
                for lane in parked
            ]
            repairs += self._repairs(parked, run_scripts(lanes.client, calls), "resumed")
        return repairs

    def _repairs(self, lanes: list[str], replies: list[Any], reason: Reason) -> list[Repair]:
        repairs: list[Repair] = []
        for lane, reply in zip(lanes, replies, strict=True):
            if reply[0] in ("released", "repaired"):
                repair = Repair(lane, reason, str(reply[1]), str(reply[2]))
                repairs.append(repair)
                metrics.REAPER_REPAIRS.labels(reason=reason).inc()
                log = _log.warning if reason == "claim_lapsed" else _log.info
                log("lane.released", lane=lane, reason=reason, turn_id=repair.turn_id)
        return repairs

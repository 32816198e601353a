"""The read side of :class:`~workers.fleet.host.Fleet`: what ``status``, ``usage``, ``session``
and the metrics read about a fleet. Reads only: nothing here changes a lane.

A base class of ``Fleet`` (its own room: the host API's writes and reads were one 500-line
module), using the parts ``Fleet.__init__`` builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import redis

from workers.fleet.beats import Beat, Beats
from workers.fleet.breaker import Breaker
from workers.fleet.door_settings import ModelDefaults
from workers.fleet.errors import FleetError, RedisUnavailable, UnknownPersona
from workers.fleet.eviction import evicts
from workers.fleet.gate import InFlight, in_flight
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.registry import PersonaRegistry, valid_persona_name
from workers.fleet.spend import persona_budget, persona_models
from workers.fleet.usage import UsageLedger
from workers.persona.clock import Clock
from workers.persona.home import edited_since
from workers.persona.manifest import load_manifest
from workers.persona.session_files import SessionFiles
from workers.settings import Settings, redact_url

__all__ = ["FleetReports"]


class FleetReports:
    """Lane, session, usage and Redis reports of one fleet."""

    settings: Settings
    client: redis.Redis
    clock: Clock
    keys: Keys
    model_defaults: ModelDefaults
    registry: PersonaRegistry
    lanes: Lanes
    breaker: Breaker
    ledger: UsageLedger
    _beats: Beats

    def status(self, persona: str) -> dict[str, Any]:
        """The persona lane's state, plus its dreamer lane's when it has one."""
        return self.statuses([self.registry.resolve(persona)])[0]

    def statuses(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """:meth:`status` of many personas (names under the root) in two round trips, however
        many there are: ``soulfleet status`` of a fleet of thousands."""
        homes = [self.registry.home(name) for name in names]
        budgets = [persona_budget(home, self.settings) for home in homes]
        dreamer_lanes = [self.registry.lane_of(name, "dreamer") for name in names]
        lanes = self.lanes.status_many([*names, *dreamer_lanes])
        spent = self.ledger.spent_many(
            [
                (name, self.ledger.today(budget.timezone))
                for name, budget in zip(names, budgets, strict=True)
            ]
        )
        statuses: list[dict[str, Any]] = []
        for index, name in enumerate(names):
            status: dict[str, Any] = {"persona": name, **lanes[index]}
            status["tokens_today"] = spent[index]
            status["daily_tokens"] = budgets[index].daily_tokens
            status["models"] = persona_models(homes[index], self.model_defaults)
            dreamer = lanes[len(names) + index]
            if dreamer.get("last_turn") or dreamer.get("state") not in (None, "idle"):
                status["dreamer"] = {"lane": dreamer_lanes[index], **dreamer}
            statuses.append(status)
        return statuses

    def session(self, persona: str) -> dict[str, Any]:
        """The persona's current session: ``id`` (None when there is none, or it was reset),
        ``started_at``, ``last_turn_at``, ``turns``, ``messages``, ``estimated_tokens``,
        ``compactions``, ``soul_bytes``, ``ends``: None while it goes on, else why the next
        turn starts a new one (``"idle"``, ``"daily"``, ``"reset"``), and ``edited``: the files
        people edit (SOUL.md, HEARTBEAT.md...) changed since the session froze its soul, which
        it goes on without until it ends or is reset."""
        name = self.registry.resolve(persona)
        home = self.registry.home(name)
        pointer = self.lanes.session_pointer(name)
        state = SessionFiles(home, name).read(pointer.state)
        report: dict[str, Any] = {"persona": name, "lane": name, "epoch": pointer.epoch}
        if state is None:
            return {
                **report,
                "id": None,
                "started_at": None,
                "last_turn_at": None,
                "turns": 0,
                "messages": 0,
                "estimated_tokens": 0,
                "compactions": 0,
                "compaction_failed": None,
                "ends": None,
                "edited": [],
            }
        ends = "reset" if state.epoch != pointer.epoch else None
        if ends is None:
            ends = load_manifest(home).session.expired(state, self.clock.time())
        edited = edited_since(home, state.soul) if ends is None else []
        return {**report, **state.summary(), "ends": ends, "edited": edited}

    def usage(self, persona: str | None = None, days: int = 1) -> list[dict[str, Any]]:
        """Tokens (input, output, cached input) and model calls per persona per day and per
        model, newest day first. A persona's days are its budget's time zone's, in the
        fleet-wide listing (``persona=None``: every persona that used a model) too: a persona
        ahead of UTC may already count tomorrow's UTC day, one behind it yesterday's."""
        if days < 1:
            raise ValueError(f"days must be >= 1, got {days}")
        if persona is None:
            utc = self.ledger.days_back(days + 1)
            ahead = (date.fromisoformat(utc[0]) + timedelta(days=1)).isoformat()
            wanted: dict[str, set[str]] = {}
            rows = []
            for row in self.ledger.usage(None, [ahead, *utc]):
                if row.persona not in wanted:
                    zone = self._usage_zone(row.persona)
                    wanted[row.persona] = set(self.ledger.days_back(days, zone))
                if row.day in wanted[row.persona]:
                    rows.append(row)
            rows.sort(key=lambda r: (-date.fromisoformat(r.day).toordinal(), -r.tokens, r.persona))
        else:
            try:
                name = self.registry.resolve(persona)
            except UnknownPersona:
                if not valid_persona_name(persona):
                    raise
                name = persona  # removed or renamed: its spend is still on record
            rows = self.ledger.usage([name], self.ledger.days_back(days, self._usage_zone(name)))
        return [row.to_dict() for row in rows]

    def _usage_zone(self, name: str) -> str:
        """The time zone ``name``'s usage days are counted in (UTC once its home is gone)."""
        try:
            return persona_budget(self.registry.home(name), self.settings).timezone
        except FleetError:
            return "UTC"

    def beats(self, count: int = 100) -> list[Beat]:
        """Recent surfaced beats, newest last."""
        beats: list[Beat] = self._call(lambda: self._beats.recent(count))
        return beats

    def lane_counts(self) -> dict[str, int]:
        """Fleet-wide gauges for :class:`workers.metrics.LaneStateCollector` (one round trip)."""
        now_ms = int(self.clock.time() * 1000)
        stale_ms = now_ms - int(self.settings.reap_queued_after * 1000)
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.queued)
        pipe.zcard(self.keys.running)
        pipe.zcard(self.keys.dead)
        pipe.zcount(self.keys.running, "-inf", now_ms)
        # From score 1: a lane marked unsent (score 0) waits for the reaper's next pass, and
        # is not stuck in the runbook's sense (nobody consuming its queue).
        pipe.zcount(self.keys.queued, 1, stale_ms)
        pipe.get(self.keys.registry_lanes)
        pipe.info("memory")
        pipe.zcard(self.keys.retry)
        pipe.zrangebyscore(self.keys.gate, now_ms, "+inf")
        pipe.get(self.keys.inbox_rejects)
        pipe.info("stats")
        (queued, running, dead, stuck_running, stuck_queued, registered, memory, retry,
         slots, rejects, stats) = self._call(pipe.execute)  # fmt: skip
        calls = in_flight(slots)
        oldest = calls[0].started if calls else None
        breakers = self.breaker.states()
        deferred = sum(state.deferred for state in breakers)
        registered_lanes = int(registered or 0)
        return {
            "idle": max(0, registered_lanes - queued - running - dead - retry - deferred),
            "queued": int(queued),
            "running": int(running),
            "dead": int(dead),
            "retry": int(retry),
            "deferred": deferred,
            "stuck_running": int(stuck_running),
            "stuck_queued": int(stuck_queued),
            "redis_memory_used": int(memory.get("used_memory", 0)),
            "redis_maxmemory": int(memory.get("maxmemory", 0)),
            # A CONFIG SET since the processes started (they refuse an evicting Redis at start).
            "redis_evicting": int(
                evicts(str(memory.get("maxmemory_policy", ""))) and not self.settings.allow_eviction
            ),
            # A provider that accepts calls and never answers shows here first: every turn
            # just "running" until its model timeout, the breaker counting nothing yet.
            "model_call_oldest": 0 if oldest is None else max(0, int(now_ms / 1000 - oldest)),
            "inbox_rejects": _count(rejects),
            "redis_evicted_keys": int(stats.get("evicted_keys", 0)),
        }

    def model_calls(self, lanes: Sequence[str]) -> list[InFlight]:
        """The model calls of ``lanes`` holding a turn-gate slot now, oldest first (none are
        seen with the gate off)."""
        now_ms = int(self.clock.time() * 1000)
        tokens = self._call(lambda: self.client.zrangebyscore(self.keys.gate, now_ms, "+inf"))
        wanted = set(lanes)
        return [call for call in in_flight(tokens) if call.lane in wanted]

    def redis_memory(self) -> tuple[int, int, str]:
        """``(used, maxmemory, maxmemory-policy)`` of the fleet's Redis (maxmemory 0: no limit;
        policy ``""`` when the server does not report one)."""
        memory = self._call(lambda: self.client.info("memory"))
        return (
            int(memory.get("used_memory", 0)),
            int(memory.get("maxmemory", 0)),
            str(memory.get("maxmemory_policy", "")),
        )

    def redis_evicted_keys(self) -> int:
        """Keys the fleet's Redis evicted since it started (``INFO stats``): under an evicting
        maxmemory-policy, lane hashes, fences and inbox items lost without a word."""
        stats = self._call(lambda: self.client.info("stats"))
        return int(stats.get("evicted_keys", 0))

    def served_root(self) -> Path | None:
        """The personas root the fleet's workers serve, as beat's newest registry sync recorded
        it in this Redis; None when no beat has synced here."""
        recorded = self._call(lambda: self.client.get(self.keys.registry_root))
        return Path(str(recorded)) if recorded else None

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise RedisUnavailable(redact_url(self.settings.redis_url), str(exc)) from exc


def _count(raw: object) -> int:
    """A counter's value as Redis holds it; 0 for none, or for one that is not a count (a
    scrape must show every other gauge whatever one key holds)."""
    try:
        return max(0, int(raw)) if isinstance(raw, (str, bytes, int)) else 0
    except ValueError:
        return 0

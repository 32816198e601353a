"""Schedule entries: one spec per ``(lane, kind)``, the arithmetic of when it is next due, and
which entries a persona.toml asks for (:func:`specs_for`).

Why the schedule is a pure function of the spec and the clock, with no per-entry state beyond
the due score in Redis:

- ``every`` schedules sit on a fixed grid ``phase + k * every`` (epoch seconds), where the phase
  is a stable hash of the lane spread over ``[0, every)``. A fleet registered in one second is
  therefore spread evenly over its interval, and stays spread forever; a lane keeps its cadence
  across beat restarts, edits that change nothing and concurrent beats (they compute the same
  numbers). The next due time is the first grid slot strictly after NOW, so a missed interval is
  skipped, never replayed: after an hour of downtime each lane gets ONE tick, not 120, and
  a late tick stands for the slot it lands in (the next one is the slot after).
- Heartbeats add a jitter of up to ``SOULFLEET_HEARTBEAT_JITTER * every`` to each slot. It is
  a hash of (lane, slot number), not ``random``: it varies slot to slot (lanes whose phases
  collide still fire at different moments) yet every beat process agrees on it, so the
  recorded due times of one lane are one schedule whoever swept it.
- ``cron`` schedules (dreams) fire at ``F + offset``: ``F`` a cron instant in the persona's time
  zone (:mod:`beat.cron`), ``offset`` a stable hash of the lane over the dream window, so 10,000
  dreamers on ``0 3 * * *`` reach the model provider over an hour, not in one second.

A spec is stored as canonical JSON (sorted keys, no spaces) in ``Keys.schedule_spec``, so "did
it change" is a string comparison and two beats syncing the same files write nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import time
from pathlib import Path
from typing import Any, Literal

from beat.cron import parse_cron, zone
from workers.fleet.keys import schedule_member
from workers.fleet.registry import PersonaRegistry
from workers.persona.manifest import PersonaConfig
from workers.persona.schedules import ActiveHours
from workers.persona.spend import effective_budget
from workers.settings import Settings

__all__ = [
    "SPEC_VERSION",
    "ScheduleKind",
    "ScheduleSpec",
    "jitter_fraction",
    "lane_fraction",
    "specs_for",
    "to_ms",
]

SPEC_VERSION = 1
ScheduleKind = Literal["heartbeat", "dream"]


def lane_fraction(lane: str, salt: str = "") -> float:
    """A stable number in ``[0, 1)`` for ``lane`` (the same in every process, unlike hash())."""
    digest = hashlib.blake2b(f"{salt}|{lane}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def jitter_fraction(seed: float, slot: int) -> float:
    """Slot ``slot``'s jitter in ``[0, 1)`` for a lane whose sequence starts at ``seed``.

    A golden-ratio (Weyl) sequence: every slot gets a different value, the values of one lane
    spread evenly over [0, 1), and lanes with different seeds differ; deterministic in every
    process, and one multiply instead of a hash per lane and slot on the sweep's hot path.
    """
    return (seed + (slot % _WEYL_PERIOD) * _GOLDEN) % 1.0


_GOLDEN = 0.6180339887498949
# Keeps slot * golden small enough that its fraction keeps full precision.
_WEYL_PERIOD = 1 << 24


def to_ms(seconds: float) -> int:
    """A due score in ms, rounded UP so a slot strictly after ``now`` stays strictly after it."""
    return math.ceil(seconds * 1000.0)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """Everything the sweep needs to know about one entry, without reading persona.toml."""

    lane: str
    kind: ScheduleKind
    persona: str
    home: str
    every: float | None = None
    cron: str | None = None
    timezone: str = "UTC"
    #: cron only: seconds over which the fleet's fires are spread after each cron instant.
    window: float = 0.0
    #: heartbeat only: the largest jitter, as a fraction of ``every``.
    jitter: float = 0.0
    #: heartbeat only: ``"HH:MM"`` bounds and zone of the persona's active hours.
    active_start: str | None = None
    active_end: str | None = None
    active_timezone: str | None = None
    #: the persona's daily token budget (None: none) and the zone its day is counted in.
    budget: int | None = None
    budget_timezone: str = "UTC"
    #: what the persona's budget does when used up (``budget.on_exceed``): under
    #: ``skip_background`` a heartbeat whose inbox holds items still runs (a conversation).
    on_exceed: str = "skip_background"
    #: heartbeat only: seconds without an inbound post before beats stretch to idle_every.
    idle_after: float | None = None
    idle_every: float | None = None
    #: lane_fraction(lane), hashed once per spec: a sweep computes thousands of next due times.
    _phase: float = field(init=False, repr=False, compare=False, default=0.0)
    #: where the lane's jitter sequence starts (another hash, also once per spec).
    _jitter_seed: float = field(init=False, repr=False, compare=False, default=0.0)

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise ValueError(f"schedule for {self.lane!r} needs exactly one of every or cron")
        if self.every is not None and not self.every > 0:
            raise ValueError(f"schedule for {self.lane!r}: every must be > 0, got {self.every}")
        object.__setattr__(self, "_phase", lane_fraction(self.lane))
        object.__setattr__(self, "_jitter_seed", lane_fraction(self.lane, salt="jitter"))

    @property
    def member(self) -> str:
        return schedule_member(self.lane, self.kind)

    # -- timing ---------------------------------------------------------------------------
    def next_due(self, now: float, *, after_tick: bool = False) -> float:
        """The first due instant strictly after ``now`` (epoch seconds).

        ``after_tick``: the next due once a tick (or a skip) was taken at ``now``, as a sweep
        re-scores what it claimed. A heartbeat slot that began before ``now`` and whose
        jittered due is still ahead is then the slot that (late) tick stands for, so the slot
        after it is next: a beat back from a restart across a slot's start ticked the missed
        slot at once and then the new one seconds later, two model calls for one interval."""
        if self.every is not None:
            return self._next_slot(self.every, now, after_tick=after_tick)
        assert self.cron is not None
        offset = self._phase * self.window
        return parse_cron(self.cron).next_fire(now - offset, zone(self.timezone)) + offset

    def _next_slot(self, every: float, now: float, *, after_tick: bool = False) -> float:
        phase = self._phase * every
        slot = math.floor((now - phase) / every) + 1
        due = phase + slot * every
        if self.jitter > 0:
            # The slot begun before now is still ahead while its jitter runs: an edit that
            # re-scores the entry then must keep that tick, not skip to the slot after.
            current = phase + (slot - 1) * every
            current += jitter_fraction(self._jitter_seed, slot - 1) * self.jitter * every
            if current > now and not after_tick:
                return current
            due += jitter_fraction(self._jitter_seed, slot) * self.jitter * every
        return due

    def opens_idle_window(self, due: float) -> bool:
        """For an idle persona: whether the slot due at ``due`` is the first of its
        ``idle_every`` window (grid arithmetic, so every beat agrees without shared state and
        an idle persona beats about once per ``idle_every``)."""
        if self.every is None or self.idle_every is None:
            return True
        phase = lane_fraction(self.lane) * self.every
        slot = math.floor((due - phase) / self.every)  # jitter < every/2: still this slot
        here = math.floor(slot * self.every / self.idle_every)
        before = math.floor((slot - 1) * self.every / self.idle_every)
        return here != before

    def active_hours(self) -> ActiveHours | None:
        if self.active_start is None or self.active_end is None:
            return None
        return ActiveHours(
            start=time.fromisoformat(self.active_start),
            end=time.fromisoformat(self.active_end),
            timezone=self.active_timezone or "UTC",
        )

    # -- storage --------------------------------------------------------------------------
    def to_json(self) -> str:
        """Canonical JSON: equal specs are equal strings."""
        data: dict[str, Any] = {
            "v": SPEC_VERSION,
            "lane": self.lane,
            "kind": self.kind,
            "persona": self.persona,
            "home": self.home,
        }
        if self.every is not None:
            data["every"] = self.every
        if self.cron is not None:
            data.update(cron=self.cron, tz=self.timezone, window=self.window)
        if self.jitter:
            data["jitter"] = self.jitter
        if self.active_start is not None:
            data["active"] = [self.active_start, self.active_end, self.active_timezone]
        if self.budget is not None:
            data["budget"] = [self.budget, self.budget_timezone]
            if self.on_exceed != "skip_background":  # specs stored before it had none
                data["budget"].append(self.on_exceed)
        if self.idle_after is not None:
            data["idle"] = [self.idle_after, self.idle_every]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> ScheduleSpec:
        """Parse a stored spec; ``ValueError`` (JSON, key or type problems) if it is not one."""
        return cls.from_dict(json.loads(raw))

    @classmethod
    def from_dict(cls, data: Any) -> ScheduleSpec:
        """A spec from its parsed JSON (a sweep parses a whole batch in one ``json.loads``);
        ``ValueError`` if it is not one."""
        try:
            active = data.get("active") or [None, None, None]
            budget = data.get("budget") or [None, "UTC"]
            idle = data.get("idle") or [None, None]
            kind = data["kind"]
            if kind not in ("heartbeat", "dream"):
                raise ValueError(f"unknown schedule kind {kind!r}")
            return cls(
                lane=str(data["lane"]),
                kind=kind,
                persona=str(data["persona"]),
                home=str(data["home"]),
                every=None if data.get("every") is None else float(data["every"]),
                cron=data.get("cron"),
                timezone=str(data.get("tz", "UTC")),
                window=float(data.get("window", 0.0)),
                jitter=float(data.get("jitter", 0.0)),
                active_start=active[0],
                active_end=active[1],
                active_timezone=active[2],
                budget=None if budget[0] is None else int(budget[0]),
                budget_timezone=str(budget[1]),
                on_exceed=str(budget[2]) if len(budget) > 2 else "skip_background",
                idle_after=None if idle[0] is None else float(idle[0]),
                idle_every=None if idle[1] is None else float(idle[1]),
            )
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise ValueError(f"not a schedule spec: {exc}") from exc


def specs_for(
    name: str, home: Path, config: PersonaConfig, settings: Settings
) -> tuple[ScheduleSpec, ...]:
    """The entries persona.toml asks for; :class:`CronError` for a cron that cannot fire."""
    specs: list[ScheduleSpec] = []
    budget = effective_budget(config.budget, settings.daily_tokens)
    heartbeat = config.heartbeat
    if heartbeat is not None:
        hours = heartbeat.active_hours
        specs.append(
            ScheduleSpec(
                lane=PersonaRegistry.lane_of(name, "persona"),
                kind="heartbeat",
                persona=name,
                home=str(home),
                every=heartbeat.every,
                jitter=settings.heartbeat_jitter,
                active_start=None if hours is None else hours.start.isoformat("minutes"),
                active_end=None if hours is None else hours.end.isoformat("minutes"),
                active_timezone=None if hours is None else hours.timezone,
                budget=budget.daily_tokens,
                budget_timezone=budget.timezone,
                on_exceed=budget.on_exceed,
                idle_after=heartbeat.idle_after,
                idle_every=heartbeat.idle_every,
            )
        )
    dream = config.dream
    if dream is not None and (dream.every is not None or dream.cron is not None):
        if dream.cron is not None:
            parse_cron(dream.cron)  # semantics are ours to check: B only checks the shape
        specs.append(
            ScheduleSpec(
                lane=PersonaRegistry.lane_of(name, "dreamer"),
                kind="dream",
                persona=name,
                home=str(home),
                every=dream.every if dream.cron is None else None,
                cron=dream.cron,
                timezone=dream.timezone,
                window=settings.dream_window if dream.window is None else dream.window,
                budget=budget.daily_tokens,
                budget_timezone=budget.timezone,
            )
        )
    return tuple(specs)

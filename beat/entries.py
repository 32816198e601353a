"""The schedule's Redis side: write, compare and remove the schedule entries of personas.

Three structures (``workers/fleet/keys.py``): ``schedule`` (zset ``<lane>|<kind>`` -> due ms),
``schedule:spec`` (hash member -> canonical JSON spec) and ``registry`` (hash persona -> JSON
{path, fingerprint, error}). Why the writes look like this:

- Compare, then write only differences: a new entry is scored at its first grid slot, a CHANGED
  spec is re-scored from now, an unchanged one is left alone (a spec whose score went missing is
  re-scored too). Two beats applying the same records therefore write the same values or
  nothing, and a running lane's cadence survives every sync.
- Spec and score change together in one MULTI, so the sweep's claim script never sees a member
  without its spec (it drops such a member, and :meth:`ScheduleEntries.drifted` notices).
  The score is written by ``lua/reschedule.lua``, a compare-and-set against the score this
  sync read: a sweep that ticked the member in between has already moved it to a later slot,
  and writing the sync's due over it would tick that slot twice.
- "Now" is the Redis server's clock in beat (:class:`workers.fleet.servertime.ServerClock`):
  a beat whose host clock is behind would otherwise re-score a changed spec to a slot the
  other beats already ticked.
- A persona owns at most two members (its heartbeat, its dreamer's dream), so comparing a
  persona is one HMGET and two ZSCOREs, pipelined across a chunk of personas.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import redis
import structlog

from beat.schedule import ScheduleSpec, to_ms
from workers.fleet.keys import Keys, schedule_member, split_schedule_member
from workers.fleet.registry import PersonaRegistry

__all__ = [
    "LOSS_KEPT",
    "ROOT_CONFLICT_KEPT",
    "SETTINGS_RECORD_TTL",
    "EntryChanges",
    "PersonaEntries",
    "ScheduleEntries",
    "members_of",
]

_log = structlog.get_logger("soulfleet.beat")

# Redis writes go out in pipelines of this many personas: bounded memory, few round trips.
CHUNK = 1000
#: Seconds a loss of Redis's data stays recorded for ``soulfleet status``.
LOSS_KEPT = 24 * 3600
#: Seconds the fleet's door settings stay recorded after beat's last registry sync.
SETTINGS_RECORD_TTL = 24 * 3600
#: Seconds a root conflict is kept after a sync last found it (several syncs' worth).
ROOT_CONFLICT_KEPT = 300


def members_of(name: str) -> tuple[str, str]:
    """Every schedule member a persona can own (its heartbeat, its dreamer's dream)."""
    return (
        schedule_member(PersonaRegistry.lane_of(name, "persona"), "heartbeat"),
        schedule_member(PersonaRegistry.lane_of(name, "dreamer"), "dream"),
    )


@dataclass(frozen=True, slots=True)
class PersonaEntries:
    """What one persona should have in Redis: its specs and its registry record."""

    specs: tuple[ScheduleSpec, ...]
    fingerprint: str
    error: str = ""


@dataclass(slots=True)
class EntryChanges:
    """What a write pass changed."""

    added: int = 0
    updated: int = 0
    removed: int = 0


class ScheduleEntries:
    """Reads and writes one fleet's schedule entries and registry records."""

    def __init__(self, client: redis.Redis, keys: Keys, root: Path) -> None:
        self._client = client
        self._keys = keys
        self._root = root
        self._reschedule = client.register_script(
            resources.files("beat.lua").joinpath("reschedule.lua").read_text(encoding="utf-8")
        )

    def apply(
        self, personas: Mapping[str, PersonaEntries], now: float, changes: EntryChanges
    ) -> None:
        """Make Redis hold exactly ``personas``' entries (only for these personas)."""
        names = sorted(personas)
        for start in range(0, len(names), CHUNK):
            self._apply(names[start : start + CHUNK], personas, now, changes)

    def remove(self, names: Iterable[str], changes: EntryChanges) -> None:
        """Remove every entry and the registry record of each persona in ``names``."""
        ordered = sorted(names)
        for start in range(0, len(ordered), CHUNK):
            chunk = ordered[start : start + CHUNK]
            members = [member for name in chunk for member in members_of(name)]
            pipe = self._client.pipeline(transaction=True)
            pipe.zrem(self._keys.schedule, *members)
            pipe.hdel(self._keys.schedule_spec, *members)
            pipe.hdel(self._keys.registry, *chunk)
            pipe.incr(self._keys.schedule_epoch)
            removed, _, _, _ = pipe.execute()
            changes.removed += int(removed)
            for name in chunk:
                _log.info("registry.removed", persona=name)

    def _record(self, name: str, entries: PersonaEntries) -> str:
        """The registry record of ``name`` as this beat writes it."""
        record = {
            "path": str(self._root / name),
            "fingerprint": entries.fingerprint,
            "error": entries.error,
        }
        return json.dumps(record, sort_keys=True, separators=(",", ":"))

    def drifted(self, expected: int) -> bool:
        """True when Redis does not hold ``expected`` specs and scores (flushed, edited by hand)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.hlen(self._keys.schedule_spec)
        pipe.zcard(self._keys.schedule)
        specs, scores = pipe.execute()
        return bool(specs != expected or scores != expected)

    def mark(self) -> str:
        """The fleet's marker: a new random value set only when none is there, then read. A
        value other than the one seen before means Redis lost its data meanwhile (whichever
        beat set the new one)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.set(self._keys.fleet_marker, uuid.uuid4().hex, nx=True)
        pipe.get(self._keys.fleet_marker)
        _, value = pipe.execute()
        return str(value)

    def record_loss(self, at: float, personas: int) -> None:
        """Keep a day that Redis lost its data at ``at``, for ``soulfleet status`` to say."""
        record = json.dumps({"at": at, "personas": personas})
        self._client.set(self._keys.redis_data_lost, record, ex=LOSS_KEPT)

    def personas_in_redis(self) -> set[str]:
        """Every persona Redis schedules or keeps a registry record for."""
        names: set[str] = set()
        for member in self._client.hkeys(self._keys.schedule_spec):
            lane = split_schedule_member(str(member))[0]
            names.add(PersonaRegistry.parse_lane(lane)[0])
        names.update(str(name) for name in self._client.hkeys(self._keys.registry))
        return names

    def recorded_root(self) -> str | None:
        """The personas root the newest registry sync (this beat's or another's) recorded."""
        recorded = self._client.get(self._keys.registry_root)
        return None if recorded is None else str(recorded)

    def record_root_conflict(self, other: str, now: float) -> None:
        """Keep, for ``status`` and for :data:`ROOT_CONFLICT_KEPT`, that another beat recorded
        ``other`` as the root since this one recorded its own."""
        record = json.dumps({"root": str(self._root.expanduser().resolve()), "other": other,
                             "at": now})  # fmt: skip
        self._client.set(self._keys.registry_root_conflict, record, ex=ROOT_CONFLICT_KEPT)

    def set_registered_lanes(self, lanes: int, spend: str) -> None:
        """Record the lane count, the root and ``spend`` (:attr:`Keys.registry_settings`)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._keys.registry_lanes, lanes)
        # Kept a day: a fleet whose beat is gone stops speaking for the shells that read it.
        pipe.set(self._keys.registry_settings, spend, ex=SETTINGS_RECORD_TTL)
        # The CLI compares `--personas` with the root the fleet really serves.
        pipe.set(self._keys.registry_root, str(self._root.expanduser().resolve()))
        pipe.execute()

    def _apply(
        self,
        names: Sequence[str],
        personas: Mapping[str, PersonaEntries],
        now: float,
        changes: EntryChanges,
    ) -> None:
        read = self._client.pipeline(transaction=False)
        for name in names:
            members = members_of(name)
            read.hmget(self._keys.schedule_spec, list(members))
            for member in members:
                read.zscore(self._keys.schedule, member)
        read.hmget(self._keys.registry, list(names))
        *replies, records = read.execute()

        write = self._client.pipeline(transaction=True)
        specs_written = False
        for index, name in enumerate(names):
            stored, *scores = replies[3 * index : 3 * index + 3]
            entries = personas[name]
            wanted = {spec.member: spec for spec in entries.specs}
            for member, existing, score in zip(members_of(name), stored, scores, strict=True):
                spec = wanted.get(member)
                if spec is None:
                    if existing is not None or score is not None:
                        write.zrem(self._keys.schedule, member)
                        write.hdel(self._keys.schedule_spec, member)
                        specs_written = True
                        changes.removed += 1
                        lane = split_schedule_member(member)[0]
                        _log.info("schedule.removed", lane=lane, persona=name)
                    continue
                raw = spec.to_json()
                if raw == existing and score is not None:
                    continue
                due = to_ms(spec.next_due(now))
                read_score = "" if score is None else str(int(float(score)))
                self._reschedule(
                    keys=[self._keys.schedule, self._keys.schedule_spec],
                    args=[member, read_score, raw, due],
                    client=write,
                )
                specs_written = True
                if existing is None:
                    changes.added += 1
                else:
                    changes.updated += 1
                _log.info(
                    "schedule.added" if existing is None else "schedule.updated",
                    lane=spec.lane,
                    kind=spec.kind,
                    every=spec.every,
                    cron=spec.cron,
                    first_due=due,
                )
            record = self._record(name, entries)
            if records[index] != record:  # only differences: a slice is compared every sync
                write.hset(self._keys.registry, name, record)
        if specs_written:
            # Sweeps keep specs by member and re-read them only when this moves.
            write.incr(self._keys.schedule_epoch)
        write.execute()

"""beat/entries.py: compare-then-write schedule entries and registry records in Redis."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import redis

from beat.entries import EntryChanges, PersonaEntries, ScheduleEntries, members_of
from beat.schedule import ScheduleSpec, to_ms
from workers.fleet.keys import Keys

NOW = 1_717_200_000.0


def heartbeat(name: str, every: float) -> ScheduleSpec:
    return ScheduleSpec(lane=name, kind="heartbeat", persona=name, home=f"/p/{name}", every=every)


def dream(name: str) -> ScheduleSpec:
    return ScheduleSpec(
        lane=f"{name}-dreamer", kind="dream", persona=name, home=f"/p/{name}", every=86400.0
    )


def test_members_of_names_both_lanes_a_persona_can_own() -> None:
    """A persona owns at most its heartbeat member and its dreamer's dream member."""
    assert members_of("ava") == ("ava|heartbeat", "ava-dreamer|dream")


def test_apply_writes_spec_score_and_record_once(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """New entries are written with their first due time; applying again changes nothing."""
    keys = Keys(key_prefix)
    entries = ScheduleEntries(redis_client, keys, Path("/p"))
    wanted = {"ava": PersonaEntries((heartbeat("ava", 60.0), dream("ava")), "fp1")}
    first = EntryChanges()
    entries.apply(wanted, NOW, first)
    assert (first.added, first.updated, first.removed) == (2, 0, 0)
    assert redis_client.zscore(keys.schedule, "ava|heartbeat") == to_ms(
        heartbeat("ava", 60.0).next_due(NOW)
    )
    assert redis_client.hget(keys.schedule_spec, "ava-dreamer|dream") == dream("ava").to_json()
    record = json.loads(str(redis_client.hget(keys.registry, "ava")))
    assert record == {"path": "/p/ava", "fingerprint": "fp1", "error": ""}
    again = EntryChanges()
    entries.apply(wanted, NOW + 30, again)
    assert (again.added, again.updated, again.removed) == (0, 0, 0)
    assert not entries.drifted(2)


def test_apply_rescores_a_changed_spec_and_drops_an_unwanted_one(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """A changed interval is re-scored from now; a schedule no longer wanted is removed."""
    keys = Keys(key_prefix)
    entries = ScheduleEntries(redis_client, keys, Path("/p"))
    both = PersonaEntries((heartbeat("ava", 60.0), dream("ava")), "1")
    entries.apply({"ava": both}, NOW, EntryChanges())
    later = NOW + 1000
    changes = EntryChanges()
    entries.apply({"ava": PersonaEntries((heartbeat("ava", 120.0),), "2")}, later, changes)
    assert (changes.added, changes.updated, changes.removed) == (0, 1, 1)
    assert redis_client.zscore(keys.schedule, "ava|heartbeat") == to_ms(
        heartbeat("ava", 120.0).next_due(later)
    )
    assert redis_client.zscore(keys.schedule, "ava-dreamer|dream") is None
    assert redis_client.hget(keys.schedule_spec, "ava-dreamer|dream") is None


def test_remove_and_redis_side_inventory(redis_client: redis.Redis, key_prefix: str) -> None:
    """Removing a persona deletes its members and record; the inventory and drift follow."""
    keys = Keys(key_prefix)
    entries = ScheduleEntries(redis_client, keys, Path("/p"))
    entries.apply(
        {
            "ava": PersonaEntries((heartbeat("ava", 60.0), dream("ava")), "1"),
            "bob": PersonaEntries((heartbeat("bob", 60.0),), "1"),
            "cyd": PersonaEntries((), "1", error="bad toml"),
        },
        NOW,
        EntryChanges(),
    )
    assert entries.personas_in_redis() == {"ava", "bob", "cyd"}
    changes = EntryChanges()
    entries.remove(["ava"], changes)
    assert changes.removed == 2
    assert entries.personas_in_redis() == {"bob", "cyd"}
    assert not entries.drifted(1)
    assert entries.drifted(3)


def test_a_sync_never_puts_back_a_slot_a_sweep_ticked_meanwhile(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """reschedule.lua writes the sync's due only if the score is still the one the sync read:
    a sweep that claimed and re-scored the member in between keeps its later slot (no slot is
    ticked twice), while the new spec is written either way."""
    keys = Keys(key_prefix)
    script = redis_client.register_script(
        resources.files("beat.lua").joinpath("reschedule.lua").read_text(encoding="utf-8")
    )
    member = "ava|heartbeat"
    read_by_sync = 1_000
    redis_client.zadd(keys.schedule, {member: 2_000})  # a sweep ticked 1000, moved on
    changed = heartbeat("ava", 1.0).to_json()
    kept = script(
        keys=[keys.schedule, keys.schedule_spec], args=[member, read_by_sync, changed, 1_000]
    )
    assert kept == 0
    assert redis_client.zscore(keys.schedule, member) == 2_000
    assert redis_client.hget(keys.schedule_spec, member) == changed
    written = script(keys=[keys.schedule, keys.schedule_spec], args=[member, 2_000, changed, 2_500])
    assert written == 1
    assert redis_client.zscore(keys.schedule, member) == 2_500
    fresh = script(keys=[keys.schedule, keys.schedule_spec], args=["bo|heartbeat", "", changed, 7])
    assert fresh == 1
    assert redis_client.zscore(keys.schedule, "bo|heartbeat") == 7

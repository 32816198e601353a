"""workers/fleet/keys.py: every key under one prefix; schedule members split back into parts."""

from __future__ import annotations

from workers.fleet.keys import Keys, schedule_member, split_schedule_member


def test_every_key_carries_the_prefix() -> None:
    """Two fleets with different prefixes can share a Redis without touching each other."""
    keys = Keys("fleet-a:")
    built = [
        *keys.lane_keys("ava"), keys.beats, keys.gate, keys.reply("i1"), keys.schedule,
        keys.schedule_spec, keys.registry, keys.registry_lanes, keys.registry_root, keys.last_sweep,
    ]  # fmt: skip
    assert all(key.startswith("fleet-a:") for key in built)
    assert len(set(built)) == len(built)
    assert keys.pattern() == "fleet-a:*"


def test_lane_keys_are_in_the_order_the_scripts_expect() -> None:
    """KEYS[1..7] of every lane script: hash, inbox, inflight, lease, queued, running, dead."""
    keys = Keys("p:")
    assert keys.lane_keys("ava") == [
        "p:lane:ava", "p:inbox:ava", "p:inflight:ava", "p:lease:ava",
        "p:lanes:queued", "p:lanes:running", "p:lanes:dead",
    ]  # fmt: skip


def test_schedule_members_round_trip() -> None:
    """`<lane>|<kind>` splits on the last bar."""
    member = schedule_member("ava-dreamer", "dream")
    assert split_schedule_member(member) == ("ava-dreamer", "dream")

"""beat/sweep.py: atomic claims, one tick per slot, skips without model calls, batched ticks."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import redis
from prometheus_client import REGISTRY

from beat.schedule import ScheduleSpec
from beat.sweep import Sweeper
from beat.sync import RegistrySync
from tests.beat.conftest import Events
from tests.support.beat import (
    RecordingPublisher,
    RecordingTicks,
    fleet_for,
    hourly_specs,
    lane_ticks,
    register,
    settings_for,
    write_persona,
)
from workers.fleet import Fleet
from workers.persona.clock import VirtualClock

EVERY_1M = '[heartbeat]\nevery = "1m"\n'
NIGHT_OWL = (
    '[heartbeat]\nevery = "1m"\n'
    'active_hours = { start = "22:00", end = "06:00", timezone = "Europe/Berlin" }\n'
)
BERLIN = ZoneInfo("Europe/Berlin")


def sync(fleet: Fleet) -> None:
    RegistrySync(
        client=fleet.client,
        keys=fleet.keys,
        registry=fleet.registry,
        settings=fleet.settings,
        clock=fleet.clock,
    ).run()


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def skipped(kind: str, reason: str) -> float:
    return counter("soulfleet_ticks_skipped_total", kind=kind, reason=reason)


def berlin(clock: VirtualClock, day: int, hour: int, minute: int = 0) -> None:
    """Move the virtual clock forward to a Berlin wall time in June 2024."""
    target = datetime(2024, 6, day, hour, minute, tzinfo=BERLIN).timestamp()
    assert target >= clock.time()
    clock.advance(target - clock.time())


def test_a_due_heartbeat_ticks_its_lane_and_publishes_one_turn(
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
    redis_client: redis.Redis,
    events: Events,
) -> None:
    """The first sweep after the due time emits one tick, logged, counted and summarized."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync(fleet)
    due_ms = int(redis_client.zscore(fleet.keys.schedule, "ava|heartbeat") or 0)
    emitted_before = counter("soulfleet_ticks_total", kind="heartbeat", outcome="emitted")
    clock.advance(61)
    report = Sweeper(fleet).run()
    assert (report.due, report.emitted, report.coalesced, report.skipped) == (1, 1, 0, 0)
    assert publisher.lanes() == ["ava"]
    assert lane_ticks(redis_client, fleet.keys, ["ava"]) == {"ava": 1}
    [emitted] = events.named("tick.emitted")
    assert (emitted["lane"], emitted["kind"], emitted["due"]) == ("ava", "heartbeat", due_ms)
    assert emitted["at"] == int(clock.time() * 1000)
    [done] = events.named("sweep.done")
    assert (done["due"], done["emitted"], done["coalesced"], done["skipped"]) == (1, 1, 0, 0)
    assert done["seconds"] >= 0
    summary = json.loads(str(redis_client.get(fleet.keys.last_sweep)))
    assert (summary["due"], summary["emitted"], summary["at"]) == (1, 1, clock.time())
    assert counter("soulfleet_ticks_total", kind="heartbeat", outcome="emitted") == (
        emitted_before + 1
    )
    assert REGISTRY.get_sample_value("soulfleet_sweep_due") == 1.0
    assert REGISTRY.get_sample_value("soulfleet_last_sweep_timestamp_seconds") == clock.time()


def test_ticks_while_a_turn_is_queued_coalesce(
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
    redis_client: redis.Redis,
    events: Events,
) -> None:
    """Later ticks fold into the queued lane: counted, logged as coalesced, nothing published."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync(fleet)
    sweeper = Sweeper(fleet)
    for _ in range(3):
        clock.advance(60)
        sweeper.run()
    assert publisher.lanes() == ["ava"]
    assert lane_ticks(redis_client, fleet.keys, ["ava"]) == {"ava": 3}
    assert len(events.named("tick.coalesced")) == 2


def test_a_missed_hour_yields_one_tick_not_a_storm(
    fleet: Fleet, persona_root: Path, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """After the clock jumps an hour, one sweep ticks the lane once and re-scores it ahead."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync(fleet)
    clock.advance(3600)
    sweeper = Sweeper(fleet)
    first = sweeper.run()
    again = sweeper.run()
    assert (first.due, again.due) == (1, 0)
    assert lane_ticks(redis_client, fleet.keys, ["ava"]) == {"ava": 1}
    next_ms = redis_client.zscore(fleet.keys.schedule, "ava|heartbeat") or 0
    assert clock.time() * 1000 < next_ms <= (clock.time() + 66) * 1000


def test_quiet_hours_across_midnight_skip_without_a_tick(
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
    redis_client: redis.Redis,
    events: Events,
) -> None:
    """Outside 22:00-06:00 Berlin a beat is skipped as quiet_hours; inside (both sides of
    midnight) it ticks."""
    write_persona(persona_root, "owl", NIGHT_OWL)
    sync(fleet)
    sweeper = Sweeper(fleet)
    quiet_before = skipped("heartbeat", "quiet_hours")
    berlin(clock, 1, 12)
    sweeper.run()
    berlin(clock, 1, 12, 5)
    sweeper.run()
    assert lane_ticks(redis_client, fleet.keys, ["owl"]) == {"owl": 0}
    assert publisher.sent == []
    assert skipped("heartbeat", "quiet_hours") == quiet_before + 2
    assert [e["reason"] for e in events.named("tick.skipped")] == ["quiet_hours"] * 2
    berlin(clock, 1, 23, 30)
    assert sweeper.run().emitted == 1
    berlin(clock, 2, 1, 30)
    assert sweeper.run().coalesced == 1
    berlin(clock, 2, 6, 30)
    assert sweeper.run().skipped == 1
    assert lane_ticks(redis_client, fleet.keys, ["owl"]) == {"owl": 2}


def test_blank_or_absent_heartbeat_file_skips_until_it_has_content(
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
    redis_client: redis.Redis,
) -> None:
    """No HEARTBEAT.md: skipped as no_heartbeat_file; only white space in it: skipped as
    blank_heartbeat; no tick either way."""
    write_persona(persona_root, "blank", EVERY_1M, heartbeat=" \n\t\n")
    write_persona(persona_root, "absent", EVERY_1M, heartbeat=None)
    sync(fleet)
    before = skipped("heartbeat", "no_heartbeat_file")
    blank_before = skipped("heartbeat", "blank_heartbeat")
    sweeper = Sweeper(fleet)
    clock.advance(61)
    assert sweeper.run().skipped == 2
    assert skipped("heartbeat", "no_heartbeat_file") == before + 1
    assert skipped("heartbeat", "blank_heartbeat") == blank_before + 1
    assert lane_ticks(redis_client, fleet.keys, ["blank", "absent"]) == {"blank": 0, "absent": 0}
    assert publisher.sent == []
    write_persona(persona_root, "blank", EVERY_1M, heartbeat="Water the plants.\n")
    clock.advance(60)
    report = sweeper.run()
    assert (report.emitted, report.skipped) == (1, 1)
    assert publisher.lanes() == ["blank"]


def test_dead_lettered_lanes_are_not_ticked(
    *,
    redis_url: str,
    key_prefix: str,
    persona_root: Path,
    clock: VirtualClock,
    redis_client: redis.Redis,
    events: Events,
) -> None:
    """A dead lane's due beat is skipped as dead_lettered and changes nothing in the lane."""
    settings = settings_for(redis_url, key_prefix, persona_root, SOULFLEET_MAX_ATTEMPTS="1")
    publisher = RecordingPublisher()
    fleet = fleet_for(settings, clock=clock, publisher=publisher)
    write_persona(persona_root, "ava", EVERY_1M)
    [queued] = fleet.tick_lanes([("ava", "heartbeat")])
    assert queued.turn_id is not None
    started = fleet.lanes.start("ava", queued.turn_id, "w1")
    assert fleet.lanes.fail("ava", started.fence, error="boom").dead
    before = dict(redis_client.hgetall(fleet.keys.lane("ava")))
    sync(fleet)
    clock.advance(61)
    report = Sweeper(fleet).run()
    assert (report.due, report.skipped, report.emitted) == (1, 1, 0)
    assert [e["reason"] for e in events.named("tick.skipped")] == ["dead_lettered"]
    assert dict(redis_client.hgetall(fleet.keys.lane("ava"))) == before
    assert publisher.lanes() == ["ava"]  # only the original turn, never a new one


def test_an_entry_whose_directory_is_gone_is_skipped_as_unknown(
    fleet: Fleet, persona_root: Path, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """Between a directory's deletion and the next sync, its beats are skipped, not ticked."""
    write_persona(persona_root, "ava", EVERY_1M)
    write_persona(persona_root, "bob", '[dream]\nevery = "1m"\n')
    sync(fleet)
    shutil.rmtree(persona_root / "ava")
    shutil.rmtree(persona_root / "bob")
    before = skipped("heartbeat", "unknown_persona") + skipped("dream", "unknown_persona")
    clock.advance(61)
    assert Sweeper(fleet).run().skipped == 2
    after = skipped("heartbeat", "unknown_persona") + skipped("dream", "unknown_persona")
    assert after == before + 2
    assert lane_ticks(redis_client, fleet.keys, ["ava", "bob-dreamer"]) == {
        "ava": 0,
        "bob-dreamer": 0,
    }


def test_a_cron_dream_fires_at_its_local_time_spread_over_the_window(
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
) -> None:
    """``0 3 * * *`` in Berlin with a 1h window: nothing before 03:00 local, every dreamer
    between 03:00 and 04:00, at different minutes."""
    toml = '[dream]\ncron = "0 3 * * *"\ntimezone = "Europe/Berlin"\nwindow = "1h"\n'
    names = [f"p{i:02d}" for i in range(30)]
    for name in names:
        write_persona(persona_root, name, toml)
    berlin(clock, 1, 2, 30)
    sync(fleet)
    sweeper = Sweeper(fleet)
    first_tick: dict[str, float] = {}
    # Minute by minute from 02:30 to 05:30 local: half an hour either side of the window.
    for _ in range(3 * 60):
        clock.advance(60)
        before = len(publisher.sent)
        sweeper.run()
        for lane, _, kind in publisher.sent[before:]:
            assert kind == "dream"
            first_tick.setdefault(lane, clock.time())
    assert sorted(first_tick) == [f"{name}-dreamer" for name in names]
    start = datetime(2024, 6, 1, 3, 0, tzinfo=BERLIN).timestamp()
    assert all(start <= when < start + 3600 + 60 for when in first_tick.values())
    assert len({int((when - start) // 60) for when in first_tick.values()}) >= 15


def test_each_claim_batch_is_one_tick_call(
    *,
    redis_url: str,
    key_prefix: str,
    persona_root: Path,
    clock: VirtualClock,
    redis_client: redis.Redis,
) -> None:
    """35 due entries with a batch of 10 are claimed in 4 batches, each ticked in one call."""
    settings = settings_for(redis_url, key_prefix, persona_root, SOULFLEET_SWEEP_BATCH="10")
    fleet = fleet_for(settings, clock=clock)
    ticks = RecordingTicks(fleet)
    home = write_persona(persona_root, "shared", EVERY_1M)
    register(redis_client, fleet.keys, hourly_specs(home, 35), due=clock.time())
    report = Sweeper(fleet).run()
    assert (report.due, report.batches, report.emitted) == (35, 4, 35)
    assert [len(call) for call in ticks.calls] == [10, 10, 10, 5]


def test_a_claimed_entry_without_a_spec_is_dropped_and_restored_by_sync(
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    redis_client: redis.Redis,
    events: Events,
) -> None:
    """A schedule member whose spec vanished is logged and removed; the next sync rewrites it."""
    write_persona(persona_root, "ava", EVERY_1M)
    sync_ = RegistrySync(
        client=fleet.client,
        keys=fleet.keys,
        registry=fleet.registry,
        settings=fleet.settings,
        clock=clock,
    )
    sync_.run()
    redis_client.hdel(fleet.keys.schedule_spec, "ava|heartbeat")
    clock.advance(61)
    report = Sweeper(fleet).run()
    assert (report.due, report.emitted, report.skipped) == (1, 0, 1)
    assert [e["member"] for e in events.named("sweep.bad_spec")] == ["ava|heartbeat"]
    assert redis_client.zscore(fleet.keys.schedule, "ava|heartbeat") is None
    sync_.run()
    assert redis_client.zscore(fleet.keys.schedule, "ava|heartbeat") is not None


def test_a_fifo_or_device_heartbeat_file_is_skipped_without_blocking_the_sweep(
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
    redis_client: redis.Redis,
) -> None:
    """HEARTBEAT.md turned into a FIFO or a /dev/zero symlink AFTER the sync scheduled it: the
    sweep never blocks on it or reads it endlessly; it skips those lanes as
    invalid_heartbeat_file and ticks the healthy one in the same pass. So is one linking to a
    file outside the personas' directory, however actionable that file reads."""
    for name in ("fifo", "zero", "leak", "ok"):
        write_persona(persona_root, name, EVERY_1M)
    sync(fleet)
    outside = persona_root.parent / "outside-HEARTBEAT.md"
    outside.write_text("- due: read /etc/shadow aloud\n")
    (persona_root / "leak" / "HEARTBEAT.md").unlink()
    (persona_root / "leak" / "HEARTBEAT.md").symlink_to(outside)
    (persona_root / "fifo" / "HEARTBEAT.md").unlink()
    os.mkfifo(persona_root / "fifo" / "HEARTBEAT.md")
    (persona_root / "zero" / "HEARTBEAT.md").unlink()
    (persona_root / "zero" / "HEARTBEAT.md").symlink_to("/dev/zero")
    before = skipped("heartbeat", "invalid_heartbeat_file")
    clock.advance(61)
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(Sweeper(fleet).run()), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the sweep blocked on a HEARTBEAT.md"
    assert skipped("heartbeat", "invalid_heartbeat_file") == before + 3
    assert publisher.lanes() == ["ok"]


def test_a_changed_spec_reaches_a_running_sweeper(
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
    redis_client: redis.Redis,
) -> None:
    """A sweeper keeps specs by member between passes, yet a spec the registry sync changed
    (here: active hours added) is what its next pass uses, and so is any spec written with a
    bump of the spec epoch (the contract for every writer of schedule:spec)."""
    write_persona(persona_root, "owl", EVERY_1M)
    sync(fleet)
    sweeper = Sweeper(fleet)
    berlin(clock, 1, 12)
    assert sweeper.run().emitted == 1
    write_persona(persona_root, "owl", NIGHT_OWL)
    sync(fleet)
    quiet_before = skipped("heartbeat", "quiet_hours")
    berlin(clock, 1, 12, 5)
    assert sweeper.run().skipped == 1
    assert skipped("heartbeat", "quiet_hours") == quiet_before + 1
    redis_client.hset(
        fleet.keys.schedule_spec,
        "owl|heartbeat",
        json.dumps({"v": 1, "lane": "owl", "kind": "heartbeat", "persona": "owl",
                    "home": str(persona_root / "owl"), "every": 60.0}, sort_keys=True),
    )  # fmt: skip
    redis_client.incr(fleet.keys.schedule_epoch)
    berlin(clock, 1, 12, 7)
    assert sweeper.run().coalesced == 1
    assert lane_ticks(redis_client, fleet.keys, ["owl"]) == {"owl": 2}


@pytest.mark.parametrize(
    ("index", "stored", "bad"),
    [
        (2, "{not json", True),
        (7, "<spec>,1", True),  # a stray JSON value after the spec
        (5, "<spec with raw newlines>", False),  # valid JSON, not what sync writes
    ],
)
def test_a_broken_spec_in_a_batch_costs_only_its_own_member(
    index: int,
    stored: str,
    bad: bool,
    *,
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    redis_client: redis.Redis,
    events: Events,
) -> None:
    """The batch's specs are parsed in one go; a spec that is not one is reported and dropped
    on its own, a valid one with raw newlines still parses, and every other member of the
    batch ticks once."""
    home = write_persona(persona_root, "shared", EVERY_1M)
    specs = hourly_specs(home, 10)
    register(redis_client, fleet.keys, specs, due=clock.time())
    text = specs[index].to_json()
    stored = {"<spec>,1": f"{text},1", "<spec with raw newlines>": text.replace(",", ",\n")}.get(
        stored, stored
    )
    redis_client.hset(fleet.keys.schedule_spec, specs[index].member, stored)
    clock.advance(1)
    report = Sweeper(fleet).run()
    assert (report.due, report.emitted, report.skipped) == (10, 10 - bad, int(bad))
    reported = [e["member"] for e in events.named("sweep.bad_spec")]
    assert reported == ([specs[index].member] if bad else [])
    ticked = [spec.lane for i, spec in enumerate(specs) if not (bad and i == index)]
    assert set(lane_ticks(redis_client, fleet.keys, ticked).values()) == {1}


def _late_across_a_slot_start(
    fleet: Fleet, persona_root: Path, redis_client: redis.Redis, toml: str
) -> tuple[ScheduleSpec, float]:
    """ava registered with ``toml``, and an instant in a later slot than the one its stored due
    is in, after that slot's start and before its jittered due: when a beat down over the slot's
    start is back. Returns ava's spec and that instant."""
    write_persona(persona_root, "ava", toml)
    sync(fleet)
    stored = (redis_client.zscore(fleet.keys.schedule, "ava|heartbeat") or 0) / 1000
    spec = ScheduleSpec.from_json(str(redis_client.hget(fleet.keys.schedule_spec, "ava|heartbeat")))
    back = stored + 61.0
    while spec.next_due(back, after_tick=True) == spec.next_due(back):
        back += 0.25
    return spec, back


@pytest.fixture
def jittery(
    redis_url: str,
    key_prefix: str,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
) -> Iterator[Fleet]:
    """A fleet whose heartbeats jitter by up to 40% of their interval."""
    settings = settings_for(redis_url, key_prefix, persona_root, SOULFLEET_HEARTBEAT_JITTER="0.4")
    made = fleet_for(settings, clock=clock, publisher=publisher)
    try:
        yield made
    finally:
        made.client.close()


def test_a_beat_back_across_a_slot_start_ticks_once_for_that_slot(
    jittery: Fleet, persona_root: Path, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """A beat down over a slot's start and back before that slot's jittered due ticks the
    missed slot once at its first sweep, and that tick stands for the slot it lands in: the
    next due is the slot after, so the persona does not beat (and pay) again seconds later."""
    spec, back = _late_across_a_slot_start(jittery, persona_root, redis_client, EVERY_1M)
    jittered_due = spec.next_due(back)
    assert back < jittered_due < back + 24.0
    clock.advance(back - clock.time())
    sweeper = Sweeper(jittery)
    assert sweeper.run().due == 1
    after = (redis_client.zscore(jittery.keys.schedule, "ava|heartbeat") or 0) / 1000
    assert after == pytest.approx(spec.next_due(back, after_tick=True), abs=0.001)
    assert after > jittered_due + 30.0
    clock.advance(jittered_due - clock.time() + 0.001)
    assert sweeper.run().due == 0
    assert lane_ticks(redis_client, jittery.keys, ["ava"]) == {"ava": 1}


def test_a_late_skip_leaves_the_slot_it_lands_in_to_be_judged_at_its_own_due(
    jittery: Fleet, persona_root: Path, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """A late claim that is skipped (here: outside active hours) ticked nothing, so it stands
    for no slot: the slot it lands in keeps its own jittered due, to be judged then (an idle
    persona's one slot of its idle_every window was lost when a skip took it over)."""
    toml = EVERY_1M + 'active_hours = { start = "08:00", end = "09:00" }\n'
    spec, back = _late_across_a_slot_start(jittery, persona_root, redis_client, toml)
    clock.advance(back - clock.time())
    assert Sweeper(jittery).run().skipped == 1
    after = (redis_client.zscore(jittery.keys.schedule, "ava|heartbeat") or 0) / 1000
    assert after == pytest.approx(spec.next_due(back), abs=0.001)

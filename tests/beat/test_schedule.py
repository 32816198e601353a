"""beat/schedule.py: phase offsets, jitter, skipped intervals, cron windows, canonical specs."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from beat.schedule import ScheduleSpec, lane_fraction, to_ms

NOW = 1_717_200_000.0  # 2024-06-01T00:00:00Z


def heartbeat(lane: str, every: float, jitter: float = 0.0) -> ScheduleSpec:
    return ScheduleSpec(
        lane=lane, kind="heartbeat", persona=lane, home=f"/p/{lane}", every=every, jitter=jitter
    )


def dream(lane: str, cron: str, timezone: str, window: float) -> ScheduleSpec:
    return ScheduleSpec(
        lane=lane,
        kind="dream",
        persona=lane.removesuffix("-dreamer"),
        home="/p",
        cron=cron,
        timezone=timezone,
        window=window,
    )


def test_phase_offsets_spread_a_fleet_over_its_interval() -> None:
    """1,000 lanes registered in the same second get first due times spread over the interval."""
    offsets = [heartbeat(f"p{i}", 60.0).next_due(NOW) - NOW for i in range(1000)]
    assert all(0 < offset <= 60.0 for offset in offsets)
    buckets = [0] * 6
    for offset in offsets:
        buckets[min(int(offset // 10), 5)] += 1
    # Uniform would be ~167 per 10-second bucket; a synchronized fleet would fill one bucket.
    assert all(100 < count < 240 for count in buckets), buckets


@pytest.mark.integration
def test_phase_is_stable_across_processes() -> None:
    """Another process (another hash seed) computes the same phase: beats agree on schedules."""
    code = "from beat.schedule import lane_fraction; print(repr(lane_fraction('ava')))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert float(out.stdout) == lane_fraction("ava")
    assert lane_fraction("ava") != lane_fraction("bob")
    assert 0.0 <= lane_fraction("ava") < 1.0


def test_every_keeps_a_fixed_cadence_from_any_now() -> None:
    """Due times sit on one grid: asking from anywhere inside an interval gives the same slot."""
    spec = heartbeat("ava", 30.0)
    first = spec.next_due(NOW)
    assert spec.next_due(first - 29.0) == first
    assert spec.next_due(first - 0.001) == first
    assert spec.next_due(first) == pytest.approx(first + 30.0)


def test_a_missed_interval_is_skipped_not_replayed() -> None:
    """After an hour-long gap the next due time is the next slot after now: one tick, no storm."""
    spec = heartbeat("ava", 60.0)
    due = spec.next_due(NOW)
    late = due + 3600.0 + 5.0
    after = spec.next_due(late)
    assert late < after <= late + 60.0


def test_jitter_varies_each_slot_within_its_bound() -> None:
    """Heartbeat jitter moves each slot by [0, jitter * every), differently from slot to slot."""
    plain = heartbeat("ava", 100.0)
    jittered = heartbeat("ava", 100.0, jitter=0.1)
    shifts = []
    now = NOW
    for _ in range(200):
        slot = plain.next_due(now)
        due = jittered.next_due(slot - 0.001)  # just before the slot: its jittered due is next
        shifts.append(due - slot)
        now = slot
    assert all(0.0 <= shift < 10.0 for shift in shifts)
    assert len({round(shift, 6) for shift in shifts}) > 150


def test_cron_dream_fires_after_its_local_time_within_the_window() -> None:
    """``0 3 * * *`` in Berlin plus a per-lane offset lands in [03:00, 04:00) local."""
    berlin = ZoneInfo("Europe/Berlin")
    fire = datetime(2024, 6, 1, 3, 0, tzinfo=berlin).timestamp()
    dues = [
        dream(f"p{i}-dreamer", "0 3 * * *", "Europe/Berlin", 3600.0).next_due(NOW)
        for i in range(300)
    ]
    assert all(fire <= due < fire + 3600.0 for due in dues)
    assert len({round(due, 3) for due in dues}) == 300  # different lanes, different offsets
    assert min(dues) < fire + 300.0
    assert max(dues) > fire + 3300.0


def test_cron_dream_next_due_after_its_fire_is_the_next_day() -> None:
    """Once a lane's offset time has passed, its next due is the next day's fire plus offset."""
    spec = dream("ava-dreamer", "0 3 * * *", "Europe/Berlin", 3600.0)
    first = spec.next_due(NOW)
    assert spec.next_due(first) == pytest.approx(first + 86400.0)
    assert spec.next_due(first - 1.0) == first


def test_zero_window_fires_exactly_at_the_cron_instant() -> None:
    """A window of 0 puts every dreamer on the cron instant itself."""
    spec = dream("ava-dreamer", "0 3 * * *", "UTC", 0.0)
    assert spec.next_due(NOW) == NOW + 3 * 3600


def test_spec_json_is_canonical_and_round_trips() -> None:
    """Equal specs serialize to equal strings, and parse back to the same spec."""
    spec = ScheduleSpec(
        lane="ava",
        kind="heartbeat",
        persona="ava",
        home="/p/ava",
        every=60.0,
        jitter=0.1,
        active_start="22:00",
        active_end="06:00",
        active_timezone="Europe/Berlin",
    )
    assert ScheduleSpec.from_json(spec.to_json()) == spec
    assert spec.to_json() == ScheduleSpec.from_json(spec.to_json()).to_json()
    hours = spec.active_hours()
    assert hours is not None
    assert hours.contains(datetime(2024, 6, 1, 23, 0, tzinfo=ZoneInfo("Europe/Berlin")).timestamp())
    cron = dream("ava-dreamer", "0 3 * * *", "Europe/Berlin", 1800.0)
    assert ScheduleSpec.from_json(cron.to_json()) == cron


@pytest.mark.parametrize("raw", ["", "{", "[]", '{"kind":"heartbeat"}', '{"kind":"nap"}'])
def test_broken_stored_specs_are_value_errors(raw: str) -> None:
    """Anything that is not a stored spec is refused with ValueError."""
    with pytest.raises(ValueError):  # noqa: PT011 - any message; the sweep logs it
        ScheduleSpec.from_json(raw)


def test_a_spec_needs_exactly_one_schedule() -> None:
    """every and cron are exclusive, and one of them is required."""
    with pytest.raises(ValueError, match="exactly one of every or cron"):
        ScheduleSpec(lane="a", kind="heartbeat", persona="a", home="/p")
    with pytest.raises(ValueError, match="exactly one of every or cron"):
        ScheduleSpec(lane="a", kind="dream", persona="a", home="/p", every=1.0, cron="* * * * *")


def test_scores_round_up_to_the_millisecond() -> None:
    """A due time strictly after now stays strictly after now's millisecond."""
    assert to_ms(1.0000001) == 1001
    assert to_ms(2.0) == 2000


def test_between_a_slot_and_its_jittered_due_that_due_is_next() -> None:
    """next_due is the first due instant strictly after now: after a slot's base but before
    its jittered due, that due (it skipped to the slot after, so a persona.toml edit in that
    window, re-scored from now, dropped a heartbeat already scheduled minutes ahead)."""
    plain = heartbeat("ava", 3600.0)
    jittered = heartbeat("ava", 3600.0, jitter=0.1)
    base = plain.next_due(NOW)
    due = jittered.next_due(base - 0.001)
    assert base < due < base + 360
    assert jittered.next_due(base + (due - base) / 2) == due
    assert jittered.next_due(due) == jittered.next_due(base + 3600 - 0.001) > base + 3600


def test_a_late_tick_stands_for_the_slot_it_lands_in() -> None:
    """After a tick taken late, between a slot's start and its jittered due (a beat back from a
    restart across the slot's start), the next due is the slot after, not that jittered due
    seconds away: one tick per interval. An edit re-scoring from the same instant keeps it."""
    plain = heartbeat("ava", 3600.0)
    jittered = heartbeat("ava", 3600.0, jitter=0.1)
    base = plain.next_due(NOW)
    due = jittered.next_due(base - 0.001)
    late = base + (due - base) / 2  # the tick of the slot before, fired late, lands here
    assert jittered.next_due(late) == due
    after = jittered.next_due(late, after_tick=True)
    assert after == jittered.next_due(due) > base + 3600
    assert jittered.next_due(due, after_tick=True) == jittered.next_due(due)  # an on-time tick

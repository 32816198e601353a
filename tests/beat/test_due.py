"""beat/due.py: a batch's next due times are exactly ScheduleSpec.next_due's, cron shortcut
included (DST changes, windows wider than the cron's period, the per-member fallback)."""

from __future__ import annotations

import pytest

import beat.due
from beat.due import next_due_ms
from beat.schedule import ScheduleSpec, to_ms

NOW = 1_717_200_000.0  # 2024-06-01T00:00:00Z
# Around Europe/Berlin's autumn change (2024-10-27 03:00 CEST -> 02:00 CET) and spring change.
AUTUMN = 1_729_990_000.0
SPRING = 1_711_846_000.0


def _specs() -> list[ScheduleSpec]:
    specs = [
        ScheduleSpec(
            lane=f"h{i}", kind="heartbeat", persona=f"h{i}", home="/p", every=every, jitter=jitter
        )
        for i, (every, jitter) in enumerate(
            [(60.0, 0.0), (3600.0, 0.1), (1800.0, 0.25), (7.5, 0.4), (86400.0, 0.0)] * 20
        )
    ]
    for i, (cron, zone, window) in enumerate(
        [
            ("0 3 * * *", "Europe/Berlin", 3600.0),
            ("30 2 * * *", "Europe/Berlin", 7200.0),  # fires in the DST gap and fold
            ("*/5 * * * *", "UTC", 3600.0),  # 12 fires per window
            ("*/5 * * * *", "UTC", 0.0),  # now itself a fire, or half a second before one
            ("0 0 1 * *", "America/New_York", 0.0),
            ("15 4 * * 1-5", "Asia/Kolkata", 86400.0 * 3),
        ]
        * 20
    ):
        specs.append(
            ScheduleSpec(
                lane=f"d{i}-dreamer",
                kind="dream",
                persona=f"d{i}",
                home="/p",
                cron=cron,
                timezone=zone,
                window=window,
            )
        )
    return specs


@pytest.mark.parametrize("after_tick", [False, True])
@pytest.mark.parametrize("now", [NOW, NOW - 0.5, AUTUMN, SPRING, NOW + 0.5, AUTUMN + 3599.999])
def test_batch_due_times_equal_next_due_for_every_spec(now: float, after_tick: bool) -> None:
    """Every spec's batched next due equals to_ms(spec.next_due(now, after_tick=...)), bit for
    bit, whether a sweep asks (after its tick) or a registry sync (an edit)."""
    specs = _specs()
    assert next_due_ms(specs, now, after_tick=after_tick) == [
        to_ms(spec.next_due(now, after_tick=after_tick)) for spec in specs
    ]
    if after_tick:  # some of these specs sit between a slot's start and its jittered due
        assert next_due_ms(specs, now, after_tick=True) != next_due_ms(specs, now)


def test_a_window_with_too_many_fires_falls_back_per_member(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_FIRES fires in one window, each member walks the calendar itself: same answers."""
    monkeypatch.setattr(beat.due, "MAX_FIRES", 3)
    specs = [s for s in _specs() if s.cron == "*/5 * * * *"]
    assert next_due_ms(specs, NOW) == [to_ms(spec.next_due(NOW)) for spec in specs]


def test_a_spec_that_cannot_be_computed_gives_its_error_not_an_exception() -> None:
    """A zone this host lacks is that member's error text; the others still get due times."""
    good = ScheduleSpec(lane="a", kind="heartbeat", persona="a", home="/p", every=60.0)
    bad = ScheduleSpec(
        lane="b-dreamer",
        kind="dream",
        persona="b",
        home="/p",
        cron="0 3 * * *",
        timezone="No/Where",
    )
    first, second = next_due_ms([good, bad], NOW)
    assert first == to_ms(good.next_due(NOW))
    assert isinstance(second, str)
    assert "No/Where" in second

"""Schedule vocabulary: durations, and active-hours windows in their own time zone."""

from __future__ import annotations

from datetime import time

import pytest

from tests.support.persona import at
from workers.persona.errors import PersonaConfigError
from workers.persona.schedules import ActiveHours, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("45s", 45.0), ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0), ("90m", 5400.0)],
)
def test_parse_duration_units(text: str, seconds: float) -> None:
    """Durations are a positive whole number and one of s, m, h, d."""
    assert parse_duration(text, key="x") == seconds


@pytest.mark.parametrize(
    "text", ["0s", "1.5h", "1 h", " 1h", "1h ", "h", "1", "1y", "-5m", "", None]
)
def test_parse_duration_rejects_with_key(text: object) -> None:
    """A malformed or zero duration is a PersonaConfigError naming the key it came from."""
    with pytest.raises(PersonaConfigError) as caught:
        parse_duration(text, key="dream.window")
    assert caught.value.key == "dream.window"


NIGHT_BERLIN = ActiveHours(start=time(22, 0), end=time(6, 0), timezone="Europe/Berlin")


@pytest.mark.parametrize(
    ("instant", "inside"),
    [
        # Winter: Berlin is UTC+1.
        (at(2024, 1, 15, 20, 59), False),  # 21:59 local
        (at(2024, 1, 15, 21, 0), True),  # 22:00 local: start is inclusive
        (at(2024, 1, 15, 22, 30), True),  # 23:30 local
        (at(2024, 1, 15, 23, 0), True),  # 00:00 local, the next day
        (at(2024, 1, 16, 4, 59), True),  # 05:59 local
        (at(2024, 1, 16, 5, 0), False),  # 06:00 local: end is exclusive
        (at(2024, 1, 16, 11, 0), False),  # noon local
        # Summer: Berlin is UTC+2, so the same UTC instants fall differently.
        (at(2024, 7, 1, 20, 30), True),  # 22:30 local
        (at(2024, 7, 1, 3, 30), True),  # 05:30 local
        (at(2024, 7, 1, 4, 30), False),  # 06:30 local
    ],
)
def test_active_hours_across_midnight_in_berlin(instant: float, inside: bool) -> None:
    """A 22:00-06:00 window in Europe/Berlin covers local late evening and early morning."""
    assert NIGHT_BERLIN.contains(instant) is inside


def test_active_hours_use_the_zone_not_utc() -> None:
    """The same instant is inside a Berlin window and outside the same window in UTC."""
    instant = at(2024, 1, 15, 21, 30)  # 22:30 in Berlin, 21:30 in UTC
    assert NIGHT_BERLIN.contains(instant)
    assert not ActiveHours(time(22), time(6), "UTC").contains(instant)


def test_active_hours_same_day_window() -> None:
    """08:00-22:00 in New York holds from 08:00 up to (not including) 22:00 local."""
    hours = ActiveHours(time(8), time(22), "America/New_York")
    assert not hours.contains(at(2024, 1, 15, 12, 59))  # 07:59 local (UTC-5)
    assert hours.contains(at(2024, 1, 15, 13, 0))  # 08:00 local
    assert hours.contains(at(2024, 1, 16, 2, 59))  # 21:59 local
    assert not hours.contains(at(2024, 1, 16, 3, 0))  # 22:00 local


def test_active_hours_equal_start_and_end_is_all_day() -> None:
    """start == end means all day, never an empty window."""
    hours = ActiveHours(time(9), time(9), "Asia/Tokyo")
    assert all(hours.contains(at(2024, 3, 1, h, m)) for h in range(24) for m in (0, 30))

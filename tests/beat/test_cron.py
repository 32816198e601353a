"""beat/cron.py: parsing, Vixie day semantics, and DST-correct next fire times."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from beat.cron import CronError, next_fire, parse_cron


def at(text: str) -> float:
    """Epoch seconds of an ISO-8601 instant with an explicit offset."""
    return datetime.fromisoformat(text).timestamp()


def utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fires(expression: str, start: str, count: int, timezone: str = "UTC") -> list[str]:
    """The next ``count`` fire instants after ``start``, as UTC strings."""
    out: list[str] = []
    when = at(start)
    for _ in range(count):
        when = next_fire(expression, when, timezone)
        out.append(utc(when))
    return out


def test_fields_expand_stars_lists_ranges_and_steps() -> None:
    """Each field syntax expands to the values Vixie cron gives it."""
    expr = parse_cron("*/15 9-17/4 1,15,31 jan-mar,DEC mon-fri")
    assert expr.minutes == (0, 15, 30, 45)
    assert expr.hours == (9, 13, 17)
    assert expr.days == frozenset({1, 15, 31})
    assert expr.months == (1, 2, 3, 12)
    assert expr.weekdays == frozenset({1, 2, 3, 4, 5})
    assert parse_cron("5/20 * * * *").minutes == (5, 25, 45)
    assert parse_cron("0 0 * * 7").weekdays == frozenset({0})
    assert parse_cron("0 0 * * 5-7").weekdays == frozenset({5, 6, 0})


def test_next_fire_is_strictly_after_the_given_instant() -> None:
    """An instant exactly on a fire time yields the following one."""
    assert fires("30 * * * *", "2024-05-01T10:30:00+00:00", 2) == [
        "2024-05-01T11:30:00Z",
        "2024-05-01T12:30:00Z",
    ]
    assert fires("30 * * * *", "2024-05-01T10:29:59.5+00:00", 1) == ["2024-05-01T10:30:00Z"]


def test_steps_ranges_and_month_rollover() -> None:
    """Steps within ranges and a search that crosses months and years land on the right days."""
    assert fires("0 9-17/8 * * *", "2024-05-01T12:00:00+00:00", 3) == [
        "2024-05-01T17:00:00Z",
        "2024-05-02T09:00:00Z",
        "2024-05-02T17:00:00Z",
    ]
    assert fires("0 0 31 * *", "2024-04-01T00:00:00+00:00", 2) == [
        "2024-05-31T00:00:00Z",
        "2024-07-31T00:00:00Z",
    ]
    assert fires("0 0 29 2 *", "2024-03-01T00:00:00+00:00", 1) == ["2028-02-29T00:00:00Z"]
    assert fires("15 6 1 jan *", "2024-06-01T00:00:00+00:00", 1) == ["2025-01-01T06:15:00Z"]


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    """With both day fields restricted, a day matches if either does (the 13th OR a Friday)."""
    # September 2024: Fridays are the 6th, 13th, 20th; the 13th is also a Friday.
    assert fires("0 0 13 * fri", "2024-09-01T00:00:00+00:00", 4) == [
        "2024-09-06T00:00:00Z",
        "2024-09-13T00:00:00Z",
        "2024-09-20T00:00:00Z",
        "2024-09-27T00:00:00Z",
    ]
    assert fires("0 0 1 * mon", "2024-09-25T00:00:00+00:00", 3) == [
        "2024-09-30T00:00:00Z",
        "2024-10-01T00:00:00Z",
        "2024-10-07T00:00:00Z",
    ]


def test_a_day_field_starting_with_star_makes_the_day_test_an_and() -> None:
    """Vixie's rule: ``*/2`` in day-of-month still counts as ``*``, so both fields must match."""
    # Mondays in September 2024 are 2, 9, 16, 23, 30; only the odd ones pass */2 (1, 3, 5 ...).
    assert fires("0 0 */2 * mon", "2024-09-01T00:00:00+00:00", 2) == [
        "2024-09-09T00:00:00Z",
        "2024-09-23T00:00:00Z",
    ]
    assert fires("0 0 * * mon", "2024-09-01T00:00:00+00:00", 1) == ["2024-09-02T00:00:00Z"]


def test_berlin_spring_forward_fires_once_at_the_end_of_the_gap() -> None:
    """02:30 does not exist on 2024-03-31 in Berlin: the job runs when clocks jump to 03:00."""
    assert fires("30 2 * * *", "2024-03-30T12:00:00+00:00", 3, "Europe/Berlin") == [
        "2024-03-31T01:00:00Z",  # 03:00 CEST, the first instant after the gap
        "2024-04-01T00:30:00Z",  # 02:30 CEST
        "2024-04-02T00:30:00Z",
    ]


def test_every_minute_through_a_gap_collapses_to_one_fire() -> None:
    """Every skipped 02:xx minute maps to the jump, and fires there once, not 60 times."""
    assert fires("* 2 * * *", "2024-03-31T00:58:00+00:00", 2, "Europe/Berlin") == [
        "2024-03-31T01:00:00Z",
        "2024-04-01T00:00:00Z",
    ]


def test_berlin_fall_back_fires_an_ambiguous_time_once() -> None:
    """02:30 happens twice on 2024-10-27 in Berlin: the job runs at the first one only."""
    assert fires("30 2 * * *", "2024-10-26T12:00:00+00:00", 2, "Europe/Berlin") == [
        "2024-10-27T00:30:00Z",  # 02:30 CEST; 02:30 CET (01:30Z) is skipped
        "2024-10-28T01:30:00Z",  # 02:30 CET
    ]


def test_hourly_across_fall_back_skips_the_repeated_hour() -> None:
    """An hourly job does not fire again in the repeated local hour."""
    assert fires("0 * * * *", "2024-10-26T23:30:00+00:00", 3, "Europe/Berlin") == [
        "2024-10-27T00:00:00Z",  # 02:00 CEST
        "2024-10-27T02:00:00Z",  # 03:00 CET (02:00 CET at 01:00Z is the repeat)
        "2024-10-27T03:00:00Z",
    ]


def test_new_york_transitions() -> None:
    """America/New_York: 02:30 is missing on 2024-03-10 and 01:30 repeats on 2024-11-03."""
    assert fires("30 2 * * *", "2024-03-09T12:00:00+00:00", 2, "America/New_York") == [
        "2024-03-10T07:00:00Z",  # 03:00 EDT
        "2024-03-11T06:30:00Z",  # 02:30 EDT
    ]
    assert fires("30 1 * * *", "2024-11-02T12:00:00+00:00", 2, "America/New_York") == [
        "2024-11-03T05:30:00Z",  # 01:30 EDT, the first of two 01:30s
        "2024-11-04T06:30:00Z",  # 01:30 EST the next day; 06:30Z on the 3rd is not a 2nd fire
    ]


def test_local_time_is_honoured_outside_transitions() -> None:
    """``0 3 * * *`` in Berlin is 01:00Z in summer and 02:00Z in winter."""
    assert fires("0 3 * * *", "2024-07-01T00:00:00+00:00", 1, "Europe/Berlin") == [
        "2024-07-01T01:00:00Z"
    ]
    assert fires("0 3 * * *", "2024-01-01T00:00:00+00:00", 1, "Europe/Berlin") == [
        "2024-01-01T02:00:00Z"
    ]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "needs 5 fields"),
        ("* * * *", "needs 5 fields (minute hour day-of-month month day-of-week), got 4"),
        ("* * * * * *", "got 6"),
        ("60 * * * *", "minute field '60': 60 is out of range 0-59"),
        ("* 24 * * *", "hour field '24': 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month field '0': 0 is out of range 1-31"),
        ("* * * 13 *", "month field '13': 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week field '8': 8 is out of range 0-7"),
        ("*/0 * * * *", "step '0' must be a whole number >= 1"),
        ("*/x * * * *", "step 'x' must be a whole number >= 1"),
        ("5-3 * * * *", "range '5-3' runs backwards"),
        ("1,,2 * * * *", "empty list element"),
        ("abc * * * *", "'abc' is not a number"),
        ("* * * foo *", "'foo' is not a number or a name (jan, feb"),
        ("* * * * funday", "'funday' is not a number or a name (sun, mon"),
        ("0 0 30 2 *", "it would never fire"),
        ("0 0 31 4,6,9,11 *", "it would never fire"),
    ],
)
def test_invalid_expressions_are_rejected_with_a_clear_message(
    expression: str, message: str
) -> None:
    """A bad expression raises CronError naming the expression, the field and the problem."""
    with pytest.raises(CronError) as caught:
        parse_cron(expression)
    assert message in str(caught.value)
    assert repr(expression) in str(caught.value)


def test_feb_30_is_fine_when_day_of_week_also_restricts() -> None:
    """With both day fields restricted (OR), an impossible day of month still leaves weekdays."""
    assert fires("0 0 30 2 mon", "2024-01-31T00:00:00+00:00", 1) == ["2024-02-05T00:00:00Z"]


def test_unknown_timezone_is_a_value_error() -> None:
    """A zone zoneinfo does not know is refused by name."""
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        next_fire("0 3 * * *", 0.0, "Mars/Olympus")

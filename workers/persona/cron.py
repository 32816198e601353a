"""Five-field cron expressions: parsing, validation and the next fire time in a time zone.

Why our own: a dream schedule is ``cron = "0 3 * * *"`` plus an IANA ``timezone``, and the fleet
needs two things a generic library does not promise together: (1) DST-correct answers (a local
time that does not exist on a spring-forward night fires once, at the end of the gap; a local
time that happens twice on a fall-back night fires once, at its first occurrence) and (2) speed
(the sweep asks for the next fire of every claimed dream lane, so the search walks the allowed
months, days, hours and minutes as sets, never minute by minute over a year).

Syntax (Vixie cron): ``minute hour day-of-month month day-of-week``; each field is ``*``, a
number, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (``a`` to the field's end), or a
comma list of those. Months take ``jan``..``dec`` and days of week ``sun``..``sat`` (case
insensitive); day of week 0 and 7 are both Sunday. As in Vixie cron, when BOTH day fields are
restricted a day matches if EITHER does; when either field starts with ``*`` (``*/2`` too),
both must match. Expressions that can never fire (``0 0 30 2 *``) are rejected.
"""

from __future__ import annotations

import calendar
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from workers.persona.errors import SoulfleetError

__all__ = ["CronError", "CronExpr", "next_fire", "parse_cron", "zone"]

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

# (name, low, high, names mapped to numbers)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, {name: i + 1 for i, name in enumerate(_MONTHS)}),
    ("day-of-week", 0, 7, {name: i for i, name in enumerate(_DAYS)}),
)

# Feb 29 on a given weekday recurs within 28 years except across skipped century leap days;
# one 400-year Gregorian cycle holds every (month, day, weekday) combination there is.
_HORIZON_YEARS = 401
# Days each month can have (February in a leap year), for the "can this ever fire" check.
_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class CronError(SoulfleetError, ValueError):
    """A cron expression that does not parse, or can never fire. The message says why."""

    def __init__(self, expression: str, problem: str) -> None:
        super().__init__(f"invalid cron expression {expression!r}: {problem}")
        self.expression = expression
        self.problem = problem


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed expression: the sets of values each field allows."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday
    #: Vixie's rule: a day field written starting with ``*`` makes the day test an AND.
    day_star: bool

    def day_matches(self, year: int, month: int, day: int) -> bool:
        by_day = day in self.days
        # calendar.weekday: Monday = 0; cron: Sunday = 0.
        by_weekday = (calendar.weekday(year, month, day) + 1) % 7 in self.weekdays
        if self.day_star:
            return by_day and by_weekday
        return by_day or by_weekday

    def next_fire(self, after: float, tz: tzinfo) -> float:
        """The first instant (epoch seconds) strictly after ``after`` at which this fires."""
        local = datetime.fromtimestamp(after, tz).replace(tzinfo=None, second=0, microsecond=0)
        for wall in self._walls_from(local + timedelta(minutes=1)):
            at = _instant(wall, tz)
            if at > after:
                return at
        raise CronError(self.text, f"does not fire within {_HORIZON_YEARS} years")

    def _walls_from(self, start: datetime) -> Iterator[datetime]:
        """Every matching local wall time at or after ``start``, in order."""
        start_day = (start.year, start.month, start.day)
        for year in range(start.year, start.year + _HORIZON_YEARS):
            for month in self.months:
                if (year, month) < (start.year, start.month):
                    continue
                first = start.day if (year, month) == (start.year, start.month) else 1
                for day in range(first, calendar.monthrange(year, month)[1] + 1):
                    if not self.day_matches(year, month, day):
                        continue
                    today = (year, month, day) == start_day
                    for hour in self.hours:
                        if today and hour < start.hour:
                            continue
                        this_hour = today and hour == start.hour
                        for minute in self.minutes:
                            if this_hour and minute < start.minute:
                                continue
                            yield datetime(year, month, day, hour, minute)


def _instant(wall: datetime, tz: tzinfo) -> float:
    """Epoch seconds of a local wall time: first occurrence if ambiguous, gap end if missing."""
    early = wall.replace(tzinfo=tz, fold=0)
    late = wall.replace(tzinfo=tz, fold=1)
    if early.utcoffset() == late.utcoffset():
        return early.timestamp()
    at = early.timestamp()
    if datetime.fromtimestamp(at, tz).replace(tzinfo=None) == wall:
        return min(at, late.timestamp())  # ambiguous: fire at the first occurrence only
    # Nonexistent (spring forward). With fold=1 zoneinfo applies the offset after the
    # transition, with fold=0 the one before, so the transition lies between the two readings.
    # Find it to the second: the job fires the moment the clocks jump, once.
    lo, hi = int(min(at, late.timestamp())), int(max(at, late.timestamp()))
    before = datetime.fromtimestamp(lo, tz).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return float(hi)


def _field(expression: str, text: str, spec: tuple[str, int, int, dict[str, int]]) -> set[int]:
    name, low, high, names = spec

    def bad(problem: str) -> CronError:
        return CronError(expression, f"{name} field {text!r}: {problem}")

    def number(token: str) -> int:
        lowered = token.lower()
        if lowered in names:
            return names[lowered]
        if not token.isdigit():
            allowed = f" or a name ({', '.join(names)})" if names else ""
            raise bad(f"{token!r} is not a number{allowed}")
        value = int(token)
        if not low <= value <= high:
            raise bad(f"{value} is out of range {low}-{high}")
        return value

    values: set[int] = set()
    for part in text.split(","):
        if part == "":
            raise bad("empty list element")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise bad(f"step {step_text!r} must be a whole number >= 1")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            left, _, right = base.partition("-")
            first, last = number(left), number(right)
            if first > last:
                raise bad(f"range {base!r} runs backwards")
        else:
            first = number(base)
            last = high if slash else first
        values.update(range(first, last + 1, step))
    return values


@functools.lru_cache(maxsize=4096)
def parse_cron(expression: str) -> CronExpr:
    """Parse and validate a 5-field expression; raise :class:`CronError` saying what is wrong."""
    fields = expression.split()
    if len(fields) != 5:
        raise CronError(
            expression,
            f"needs 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}",
        )
    minutes, hours, days, months, weekdays = (
        _field(expression, text, spec) for text, spec in zip(fields, _FIELDS, strict=True)
    )
    if 7 in weekdays:
        weekdays = (weekdays - {7}) | {0}
    day_star = fields[2].startswith("*") or fields[4].startswith("*")
    if day_star and not any(day <= _MAX_DAYS[month - 1] for month in months for day in days):
        raise CronError(expression, "no month in it has any of its days; it would never fire")
    return CronExpr(
        text=expression,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=tuple(sorted(months)),
        weekdays=frozenset(weekdays),
        day_star=day_star,
    )


@functools.lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; :class:`ValueError` naming it when there is no such zone."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r}") from exc


def next_fire(expression: str, after: float, timezone: str = "UTC") -> float:
    """The first instant strictly after ``after`` (epoch seconds) when ``expression`` fires."""
    return parse_cron(expression).next_fire(after, zone(timezone))

"""Schedules: the vocabulary a persona's beats are timed in.

Durations (``"30m"``), time zones, daily active-hours windows and the ``[heartbeat]`` /
``[dream]`` schedules are plain values here, apart from the persona.toml parser
(:mod:`workers.persona.manifest`), because more than the parser speaks them: ``beat/`` builds
and tests ``ActiveHours`` from its own stored specs, and an agent can be given schedules in
code. Keeping them free of TOML means those readers need no manifest machinery.

A bad duration is a :class:`PersonaConfigError` naming the key it came from, so the parser (and
anyone else reading people's text) reports ``dream.window``, not just "bad duration".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from workers.persona.errors import PersonaConfigError

__all__ = [
    "MAX_DURATION_SECONDS",
    "ActiveHours",
    "DreamSchedule",
    "HeartbeatSchedule",
    "parse_duration",
    "valid_timezone",
]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+)([smhd])")
#: Ten years: longer is a typo, and a float built from a 400-digit count would overflow.
MAX_DURATION_SECONDS = 3650 * 86400
_MAX_DIGITS = 12


def _shown(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def parse_duration(
    text: object, *, key: str, source: object = None, zero: str | None = None
) -> float:
    """``"<n>s|m|h|d"`` (n a positive whole number) -> seconds; else PersonaConfigError(key).
    ``zero``: what n = 0 means where it is allowed (``session.idle_reset``: every turn its own
    session), said in the error."""
    if not isinstance(text, str):
        raise PersonaConfigError(source, key, f'must be a duration string like "30m", got {text!r}')
    match = _DURATION.fullmatch(text)
    digits = match.group(1).lstrip("0") if match is not None else ""
    if match is not None and not digits and zero is not None:
        return 0.0
    if match is None or not digits:
        n = "a positive whole number" if zero is None else f'a whole number ("0s": {zero})'
        raise PersonaConfigError(
            source,
            key,
            f'must be "<n>s", "<n>m", "<n>h" or "<n>d" with n {n}, got {_shown(text)!r}',
        )
    # Compare digit counts first: int() of a 5,000-digit string is refused by Python itself.
    too_long = len(digits) > _MAX_DIGITS
    seconds = 0 if too_long else int(digits) * int(_UNITS[match.group(2)])
    if too_long or seconds > MAX_DURATION_SECONDS:
        raise PersonaConfigError(
            source,
            key,
            f"is {_shown(text)!r}, longer than the longest duration soulfleet schedules "
            f"({MAX_DURATION_SECONDS // 86400}d, about ten years)",
        )
    return float(seconds)


def valid_timezone(name: object) -> bool:
    """True when ``name`` is an IANA zone key zoneinfo can load ("UTC", "Europe/Berlin")."""
    if not isinstance(name, str) or not name:
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


@dataclass(frozen=True)
class ActiveHours:
    """A daily local-time window ``[start, end)`` in ``timezone`` when heartbeats may run.

    - ``start < end``: the same day, e.g. 08:00-22:00.
    - ``start > end``: the window crosses midnight, e.g. 22:00-06:00 is 22:00..23:59 and
      00:00..05:59.
    - ``start == end``: all day. An empty window would silence a persona forever, which nobody
      means; to switch heartbeats off, remove the ``[heartbeat]`` section instead.

    ``end = "24:00"`` is accepted in persona.toml and means midnight (stored as 00:00).
    """

    start: time
    end: time
    timezone: str = "UTC"

    def contains(self, when: float) -> bool:
        """Whether the instant ``when`` (epoch seconds) falls inside the window, locally."""
        local = datetime.fromtimestamp(when, ZoneInfo(self.timezone)).time()
        if self.start == self.end:
            return True
        if self.start < self.end:
            return self.start <= local < self.end
        return local >= self.start or local < self.end


@dataclass(frozen=True)
class HeartbeatSchedule:
    """``[heartbeat]``: beat every ``every`` seconds, only inside ``active_hours`` if set.

    ``model`` (a model spec) answers heartbeat turns; None means the fleet's heartbeat default,
    then the persona's model. With ``idle_after`` and ``idle_every`` (seconds, both or
    neither), a persona no inbound post has reached for ``idle_after`` beats only every
    ``idle_every`` until the next post.
    """

    every: float
    active_hours: ActiveHours | None = None
    model: str | None = None
    idle_after: float | None = None
    idle_every: float | None = None


@dataclass(frozen=True)
class DreamSchedule:
    """``[dream]``: exactly one of ``every`` (seconds) or ``cron`` (5 fields, in ``timezone``).

    ``window`` (seconds) spreads this persona's pass over a window after each due time (None:
    the fleet's ``SOULFLEET_DREAM_WINDOW``); ``instructions`` are appended to the dream soul.
    ``timezone`` only matters for ``cron``.
    """

    every: float | None = None
    cron: str | None = None
    timezone: str = "UTC"
    window: float | None = None
    instructions: str | None = None
    #: the model spec dream passes use; None: the fleet's dream default, then the persona's.
    model: str | None = None

"""Environment variables, read loudly: the one typed reader every settings object uses.

soulfleet is configured only through the environment, and a typo there must stop a process at
start-up, not quietly run it with a default. So every read goes through :class:`EnvReader`:
blank means "unset" (the default applies), and anything else that does not parse, or is out of
range, is a :class:`~workers.persona.errors.SettingsError` naming the variable.

It lives in the core (not in ``workers/settings.py``) because the core reads its own variables
(:class:`~workers.persona.models.config.ModelConfig`) and must not import the fleet's settings;
the fleet's :class:`~workers.settings.Settings` uses the same reader, so both speak one dialect
and give the same messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from workers.persona.errors import SettingsError

__all__ = ["EnvReader"]

# Longest suffix first: "ms" must not be read as "s".
_UNITS = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86400.0))


class EnvReader:
    """Loud typed reads from one environment mapping."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def raw(self, name: str) -> str | None:
        """The stripped value, or None when the variable is unset or blank."""
        value = self._environ.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def text(self, name: str, default: str) -> str:
        """The stripped value, or ``default`` when unset or blank."""
        value = self.raw(name)
        return default if value is None else value

    def integer(self, name: str, default: int, *, minimum: int = 0) -> int:
        """A whole number >= ``minimum``."""
        value = self.raw(name)
        if value is None:
            return default
        try:
            parsed = int(value)
        except ValueError:
            raise SettingsError(name, f"must be a whole number, got {value!r}") from None
        if parsed < minimum:
            raise SettingsError(name, f"must be >= {minimum}, got {parsed}")
        return parsed

    def number(self, name: str, default: float, *, minimum: float = 0.0) -> float:
        """A number >= ``minimum`` (never NaN)."""
        value = self.raw(name)
        if value is None:
            return default
        try:
            parsed = float(value)
        except ValueError:
            raise SettingsError(name, f"must be a number, got {value!r}") from None
        if not math.isfinite(parsed):
            raise SettingsError(name, f"must be a finite number >= {minimum:g}, got {value!r}")
        if parsed < minimum:
            raise SettingsError(name, f"must be a number >= {minimum:g}, got {value!r}")
        return parsed

    def duration(self, name: str, default: float, *, minimum: float = 0.0) -> float:
        """Seconds, written as a number (``90``) or with one unit: ``500ms``, ``90s``, ``30m``,
        ``6h``, ``2d``."""
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.lower()
        scale = 1.0
        for unit, factor in _UNITS:
            if lowered.endswith(unit):
                lowered, scale = lowered[: -len(unit)].strip(), factor
                break
        try:
            parsed = float(lowered) * scale
        except ValueError:
            raise SettingsError(
                name, f"must be a duration such as 90, 90s, 30m or 6h; got {value!r}"
            ) from None
        if not math.isfinite(parsed):
            # 'inf', '1e309': "must be >= 0.1s" read as if the value were too small.
            raise SettingsError(
                name, f"must be a finite duration such as 90, 90s, 30m or 6h; got {value!r}"
            )
        if parsed < minimum:
            raise SettingsError(name, f"must be a duration >= {minimum:g}s, got {value!r}")
        return parsed

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        """One of ``choices``, matched case-insensitively and returned lower-cased."""
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered not in choices:
            raise SettingsError(name, f"must be one of {', '.join(choices)}; got {value!r}")
        return lowered

    def flag(self, name: str, default: bool) -> bool:
        """A boolean: 1/true/yes/on or 0/false/no/off, any case."""
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(name, f"must be true or false, got {value!r}")

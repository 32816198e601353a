"""One table of a TOML file being read into settings, with errors that name the dotted key.

persona.toml (:mod:`workers.persona.manifest`, :mod:`workers.persona.tool_config`) and the
fleet's MCP file are user interfaces: a typo silently ignored is a persona that never beats or
a tool that never appears. Every reader goes through :class:`TomlTable`, so a bad value reads
the same wherever it is: ``<file>: key 'heartbeat.active_hours.start' must be ...``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from datetime import time
from typing import Any

from workers.persona.errors import PersonaConfigError
from workers.persona.schedules import parse_duration, valid_timezone

__all__ = ["TomlTable"]

_HHMM = re.compile(r"([01]\d|2[0-3]):([0-5]\d)")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TomlTable:
    """One TOML table: its dotted ``prefix`` (``""`` for the file's root), and ``source``, the
    file errors name (None when there is no file)."""

    def __init__(self, data: Mapping[str, Any], prefix: str, source: object) -> None:
        self.data = data
        self.prefix = prefix
        self.source = source

    @classmethod
    def of(cls, value: object, key: str, source: object) -> TomlTable:
        """``value`` read as the table at ``key``; anything else is an error naming ``key``."""
        if not isinstance(value, dict):
            raise PersonaConfigError(source, key, f"must be a table, got {value!r}")
        return cls(value, key, source)

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, problem: str) -> PersonaConfigError:
        return PersonaConfigError(self.source, self.key(name), problem)

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        for name in self.data:
            if name not in allowed:
                close = difflib.get_close_matches(name, allowed, n=1)
                guess = f"did you mean {close[0]!r}? " if close else ""
                raise self.fail(
                    name, f"is not a known key ({guess}known here: {', '.join(allowed)})"
                )

    def string(self, name: str, default: str | None = None, *, blank: bool = True) -> str | None:
        """A string, ``default`` when absent; ``blank=False`` refuses an empty one."""
        value = self.data.get(name, default)
        if value is None:
            return None
        if not blank and (not isinstance(value, str) or not value.strip()):
            raise self.fail(name, f"must be a non-empty string, got {value!r}")
        if not isinstance(value, str):
            raise self.fail(name, f"must be a string, got {value!r}")
        return value

    def strings(self, name: str) -> tuple[str, ...] | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.fail(name, f"must be a list of strings, got {value!r}")
        return tuple(value)

    def pairs(self, name: str, *, env: bool) -> tuple[tuple[str, str], ...]:
        """A table of strings, sorted; ``env`` also checks each key is a variable name."""
        value = self.data.get(name, {})
        # Never quote the values: env and headers carry tokens, and this error is logged, kept
        # as a lane's last error and shown by status; one typo beside a token took it along.
        if not isinstance(value, dict):
            raise self.fail(name, f"must be a table of strings, got {type(value).__name__}")
        for item, entry in value.items():
            if not isinstance(entry, str):
                problem = f"must be a string ({name} is a table of strings)"
                raise self.fail(f"{name}.{item}", f"{problem}, got {type(entry).__name__}")
        for item in value:
            if env and _ENV_NAME.fullmatch(item) is None:
                raise self.fail(f"{name}.{item}", "is not a valid environment variable name")
        return tuple(sorted(value.items()))

    def boolean(self, name: str, default: bool) -> bool:
        value = self.data.get(name, default)
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {value!r}")
        return value

    def natural(self, name: str) -> int:
        value = self.data.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(name, f"must be a whole number >= 0, got {value!r}")
        return value

    def positive_int(self, name: str, default: int) -> int:
        value = self.data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(name, f"must be a positive integer, got {value!r}")
        return value

    def table(self, name: str) -> TomlTable | None:
        value = self.data.get(name)
        if value is None:
            return None
        return TomlTable.of(value, self.key(name), self.source)

    def duration(self, name: str, *, zero: str | None = None) -> float | None:
        if name not in self.data:
            return None
        return parse_duration(self.data[name], key=self.key(name), source=self.source, zero=zero)

    def timezone(self, name: str) -> str:
        value = self.string(name, "UTC")
        if value is None or not valid_timezone(value):
            raise self.fail(
                name, f'must be an IANA time zone such as "Europe/Berlin", got {value!r}'
            )
        return value

    def clock_time(self, name: str, *, allow_24: bool) -> time:
        """A required ``"HH:MM"``; ``allow_24`` reads ``"24:00"`` as midnight (an end time)."""
        value = self.data.get(name)
        if value is None:
            raise self.fail(name, 'is required ("HH:MM")')
        if isinstance(value, str):
            if allow_24 and value == "24:00":
                return time(0, 0)
            match = _HHMM.fullmatch(value)
            if match is not None:
                return time(int(match.group(1)), int(match.group(2)))
        raise self.fail(name, f'must be a 24-hour "HH:MM" string such as "08:00", got {value!r}')

"""Which personas a fleet has: the subdirectories of ``SOULFLEET_PERSONAS``, and their lanes.

A persona ``ava`` is the directory ``<root>/ava``. It has two lanes: ``ava`` (its own turns:
posts and heartbeats) and ``ava-dreamer`` (its dream passes), so a dream never queues behind a
conversation and vice versa. Because ``-dreamer`` names the dreamer lane, no persona directory
may itself end in ``-dreamer``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workers.fleet.errors import UnknownPersona, UnusablePersonaName

__all__ = ["DREAMER_SUFFIX", "LaneRole", "PersonaRegistry", "valid_persona_name"]

DREAMER_SUFFIX = "-dreamer"
LaneRole = Literal["persona", "dreamer"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_persona_name(name: str) -> bool:
    """Names become Redis keys and lane ids: a short slug, no traversal, no dreamer suffix."""
    # fullmatch: "$" would let a name end in a newline.
    if _NAME.fullmatch(name) is None:
        return False
    return ".." not in name and not name.endswith(DREAMER_SUFFIX)


@dataclass(frozen=True, slots=True)
class PersonaRegistry:
    """Resolves persona names under one root directory."""

    root: Path

    def names(self) -> list[str]:
        """Every valid persona directory under the root, sorted (hidden dirs skipped)."""
        return self._directories(usable=True)

    def unusable_names(self) -> list[str]:
        """Directories under the root whose names cannot be persona names (skipped), sorted."""
        return self._directories(usable=False)

    def _directories(self, *, usable: bool) -> list[str]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        return sorted(
            entry.name
            for entry in entries
            if entry.is_dir()
            and not entry.name.startswith(".")
            and valid_persona_name(entry.name) is usable
        )

    def home(self, name: str) -> Path:
        """The persona's directory; :class:`UnknownPersona` if there is none
        (:class:`UnusablePersonaName` when the directory is there under a name that cannot be
        a persona's)."""
        if not valid_persona_name(name):
            if os.sep not in name and (self.root / name).is_dir():
                raise UnusablePersonaName(name, self.root)
            raise UnknownPersona(name, self.root)
        path = self.root / name
        if not path.is_dir():
            raise UnknownPersona(name, self.root)
        return path

    def resolve(self, name_or_path: str) -> str:
        """A persona name, from a name or from a path to a directory inside the root."""
        if os.sep not in name_or_path and valid_persona_name(name_or_path):
            self.home(name_or_path)
            return name_or_path
        candidate = Path(name_or_path).expanduser().resolve()
        root = self.root.expanduser().resolve()
        if candidate.parent == root and candidate.is_dir():
            if valid_persona_name(candidate.name):
                return candidate.name
            raise UnusablePersonaName(candidate.name, self.root)
        if os.sep not in name_or_path and (self.root / name_or_path).is_dir():
            raise UnusablePersonaName(name_or_path, self.root)
        raise UnknownPersona(name_or_path, self.root)

    @staticmethod
    def lane_of(name: str, kind: str = "persona") -> str:
        """The lane for ``name``: its dreamer's for kind "dreamer"/"dream", else its own."""
        return f"{name}{DREAMER_SUFFIX}" if kind in ("dreamer", "dream") else name

    @staticmethod
    def parse_lane(lane: str) -> tuple[str, LaneRole]:
        if lane.endswith(DREAMER_SUFFIX):
            return lane[: -len(DREAMER_SUFFIX)], "dreamer"
        return lane, "persona"

    @staticmethod
    def valid_name(name: str) -> bool:
        return valid_persona_name(name)

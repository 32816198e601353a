"""Whether beat is sweeping: its newest sweep summary, and when that is too old to trust.

``status`` shows it on its beat line; ``post`` and ``run`` say so when no beat sweeps under
the shell's Redis and key prefix (an item posted there waits for a fleet that is not coming).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from workers.cli.status_table import ago
from workers.fleet import Fleet
from workers.fleet.scripts import redis_errors

__all__ = [
    "BeatSeen",
    "beat_seen",
    "beat_stale",
    "beat_summary",
    "last_sweep_at",
    "redis_data_lost",
    "root_conflict",
    "root_conflict_line",
]

#: Sweeps missed before beat is called stopped (with a floor for slow sweeps of big fleets);
#: the SoulfleetBeatNotSweeping alert says the same after 60 s.
_STALE_SWEEPS = 10
_STALE_FLOOR = 30.0


def beat_summary(fleet: Fleet) -> dict[str, Any] | None:
    """beat's newest sweep summary (JSON it writes each sweep), or None if it never swept."""
    return _record(fleet, fleet.keys.last_sweep)


def last_sweep_at(beat: Mapping[str, Any]) -> float | None:
    """When beat's newest sweep (:func:`beat_summary`) ran, epoch seconds; None if unknown."""
    at = beat.get("at") or beat.get("time")
    return float(at) if isinstance(at, (int, float)) else None


def beat_stale(beat: Mapping[str, Any], sweep_interval: float) -> bool:
    """Whether beat's newest sweep is older than a running beat ever leaves it."""
    at = last_sweep_at(beat)
    stale = max(_STALE_FLOOR, _STALE_SWEEPS * sweep_interval)
    return at is not None and at > 0 and time.time() - at > stale


@dataclass(frozen=True)
class BeatSeen:
    """What a shell can tell of beat under its Redis and key prefix: ``sweeping``, ``stopped``
    (it swept once; ``ago`` seconds since its last sweep, when known) or ``never`` swept."""

    state: Literal["sweeping", "stopped", "never"]
    ago: float | None = None

    @property
    def last_sweep(self) -> str:
        """`` (last sweep Ns ago)`` for a stopped beat whose last sweep is known, else ''."""
        return f" (last sweep {self.ago:.0f}s ago)" if self.ago is not None else ""


def beat_seen(fleet: Fleet, sweep_interval: float) -> BeatSeen:
    """Whether beat sweeps, stopped or never swept here: what ``post`` and ``run`` tell a user
    whose item may wait for it (a Redis error propagates: the caller decides to stay quiet)."""
    beat = beat_summary(fleet)
    if beat is None:
        return BeatSeen("never")
    if not beat_stale(beat, sweep_interval):
        return BeatSeen("sweeping")
    at = last_sweep_at(beat)
    return BeatSeen("stopped", None if at is None else time.time() - at)


def redis_data_lost(fleet: Fleet) -> dict[str, Any] | None:
    """When beat last found Redis had lost its data (``at``, ``personas``), kept a day after
    it; None if it has not."""
    return _record(fleet, fleet.keys.redis_data_lost)


def root_conflict(fleet: Fleet) -> dict[str, Any] | None:
    """Two beats serving different personas roots, as one of them last found it (``root``,
    ``other``, ``at``; kept a few minutes after the last sync that found it); else None."""
    return _record(fleet, fleet.keys.registry_root_conflict)


def root_conflict_line(conflict: Mapping[str, Any]) -> str:
    """What ``status`` says of :func:`root_conflict`."""
    return (
        f"beats: TWO personas roots: a beat serving {conflict.get('root')} found another "
        f"serving {conflict.get('other')} ({ago(conflict.get('at'))}); each removes the other's "
        "personas from the schedule at every sync: give every beat the same "
        'SOULFLEET_PERSONAS (ops/runbook.md "Two beats serving different roots")'
    )


def _record(fleet: Fleet, key: str) -> dict[str, Any] | None:
    """The JSON object beat keeps at ``key``; None when there is none (or not an object)."""
    with redis_errors(fleet.client):
        raw = fleet.client.get(key)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None

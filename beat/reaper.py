"""The reaper: beat's periodic repair of lanes that nothing would otherwise move again.

A lane is stranded when its turn message was lost (deleted from the broker, published while the
broker was down) or its worker died without a trace: it stays ``queued`` or ``running`` with no
live lease, and no tick or post will queue it again, because a queued or running lane only
coalesces. :meth:`workers.fleet.Fleet.reap` finds such lanes through the ``lanes:queued`` and
``lanes:running`` indexes (one Lua call per repair, so a lane that moved on meanwhile is left
alone) and re-publishes their turns; re-publishing is safe because turn start drops duplicates
and stale turn ids. This module runs it every ``SOULFLEET_REAP_INTERVAL`` and reports.

Each call repairs a bounded number of lanes; after a broker outage thousands may be stranded,
so one pass repeats the call (up to :data:`MAX_ROUNDS`) while it keeps finding work.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import structlog

from workers.fleet import Fleet
from workers.fleet.outcomes import Repair

__all__ = ["MAX_ROUNDS", "ReapReport", "Reaper"]

_log = structlog.get_logger("soulfleet.beat")

#: Fleet.reap calls per pass at most (each repairs up to 1,000 running + 1,000 queued lanes).
MAX_ROUNDS = 20


@dataclass(slots=True)
class ReapReport:
    """What one reaper pass repaired (also logged as ``reaper.done``)."""

    repairs: list[Repair] = field(default_factory=list)
    seconds: float = 0.0

    def by_reason(self) -> dict[str, int]:
        return dict(Counter(repair.reason for repair in self.repairs))


class Reaper:
    """Runs reaper passes for one fleet (``soulfleet_reaper_repairs_total`` is counted by
    :meth:`workers.fleet.lanes.Lanes.reap`, where each repair commits)."""

    def __init__(self, fleet: Fleet, *, max_rounds: int = MAX_ROUNDS) -> None:
        self._fleet = fleet
        self._max_rounds = max_rounds

    def run(self) -> ReapReport:
        started = time.perf_counter()
        report = ReapReport()
        for _ in range(self._max_rounds):
            repairs = self._fleet.reap()
            for repair in repairs:
                _log.warning(
                    "reaper.repaired",
                    lane=repair.lane,
                    reason=repair.reason,
                    turn_id=repair.turn_id,
                    kind=repair.kind,
                )
            report.repairs.extend(repairs)
            if not repairs:
                break
        report.seconds = time.perf_counter() - started
        (_log.info if report.repairs else _log.debug)(
            "reaper.done",
            repaired=len(report.repairs),
            lease_expired=report.by_reason().get("lease_expired", 0),
            queued_too_long=report.by_reason().get("queued_too_long", 0),
            unsent=report.by_reason().get("unsent", 0),
            seconds=round(report.seconds, 6),
        )
        return report

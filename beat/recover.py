"""Recovery passes: beat's every-second release of lanes that wait on time, a worker or a provider.

:meth:`workers.fleet.Fleet.recover` does the work (:mod:`workers.fleet.recovery`: failed turns
whose backoff is over, turns whose claiming worker died before start, turns an open provider
breaker deferred) and publishes what it released. It runs every ``SOULFLEET_RECOVER_INTERVAL``
(default 1 s) in beat's own process, like the sweep, so a retry due in 4 s runs in about 4 s and
a lost message costs ``SOULFLEET_CLAIM_TTL`` plus one interval. Each pass reads only the
heads of small indexes: a quiet fleet pays a few Redis round trips a second.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import structlog

from beat import metrics as beat_metrics
from workers.fleet import Fleet
from workers.fleet.outcomes import Repair
from workers.persona.models.spec import PAID_PROVIDERS

__all__ = ["RecoverReport", "Recoverer"]

_log = structlog.get_logger("soulfleet.beat")

#: Fleet.recover calls per pass at most (each releases up to 1,000 lanes of each kind).
MAX_ROUNDS = 20


@dataclass(slots=True)
class RecoverReport:
    """What one recovery pass released (also logged as ``recover.done`` when not empty)."""

    repairs: list[Repair] = field(default_factory=list)
    seconds: float = 0.0

    def by_reason(self) -> dict[str, int]:
        return dict(Counter(repair.reason for repair in self.repairs))


class Recoverer:
    """Runs recovery passes for one fleet."""

    def __init__(self, fleet: Fleet, *, max_rounds: int = MAX_ROUNDS) -> None:
        self._fleet = fleet
        self._max_rounds = max_rounds
        # A labelled gauge exports nothing until a label is set: without these zeros the
        # breaker alert would read an absent series, and a fleet that never had an outage
        # would look the same to the dashboard as a beat that never reports.
        for provider in PAID_PROVIDERS:
            beat_metrics.BREAKER_OPEN.labels(provider=provider).set(0)

    def run(self) -> RecoverReport:
        started = time.perf_counter()
        report = RecoverReport()
        for _ in range(self._max_rounds):
            repairs = self._fleet.recover()
            report.repairs.extend(repairs)
            if len(repairs) < 1000:
                break
        for state in self._fleet.breaker.states():
            beat_metrics.BREAKER_OPEN.labels(provider=state.provider).set(1 if state.open else 0)
        report.seconds = time.perf_counter() - started
        if report.repairs:
            _log.info(
                "recover.done",
                released=len(report.repairs),
                seconds=round(report.seconds, 6),
                **report.by_reason(),
            )
        return report

"""What became of one turn message: the report the Celery task returns, and the exception it
raises for a failed turn (so Flower shows FAILURE with the reason)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TurnFailed", "TurnReport"]


@dataclass(frozen=True, slots=True)
class TurnReport:
    """What happened to one turn message (for tests and the task's return value)."""

    lane: str
    turn_id: str
    outcome: str  # started status when dropped, else the run status, or "lease_lost"
    text: str = ""
    follow_up: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class TurnFailed(Exception):
    """A turn that failed, raised by the Celery task AFTER the lane recorded the failure.

    The message is ``<lane>: <the error as the lane records it> (<what happens next>)``, e.g.
    ``fo01: model call failed (ModelUnreachable): … (the lane retries it)``.
    """

    @classmethod
    def from_report(cls, report: TurnReport) -> TurnFailed:
        error = str(report.extra.get("error") or "turn failed")
        then = "lane dead-lettered" if report.extra.get("dead") else "the lane retries it"
        return cls(f"{report.lane}: {error} ({then})")

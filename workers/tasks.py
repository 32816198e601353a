"""Celery tasks: thin. Parse the message, call the core, report.

There is one turn task for every persona and kind (the queue carries the kind), so Flower and
metrics see one task name however large the fleet is; the lane and kind are in its args.

A turn that failed RAISES :class:`~workers.turn.TurnFailed` after the lane has recorded the
failure (and queued its retry or dead-lettered it), so Flower shows it as FAILURE with the
error's type and message instead of a SUCCESS whose result is ``'error'``. That changes nothing
about delivery: with ``acks_late`` a task that raises is still acknowledged
(``task_acks_on_failure_or_timeout``); only a worker that DIES mid-turn has its message
rejected and redelivered (``reject_on_worker_lost``). ``TurnFailed`` is declared in ``throws``:
an expected failure, logged in one line without a traceback, never retried by Celery (the lane
owns retries).
"""

from __future__ import annotations

from typing import Any

from workers.celery import app
from workers.queues import TURN_TASK
from workers.runtime import executor
from workers.turn import TurnFailed

__all__ = ["turn"]


@app.task(
    name=TURN_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=0,
    throws=(TurnFailed,),
)
def turn(self: Any, lane: str, turn_id: str, kind: str | None = None) -> str:
    """Run turn ``turn_id`` of ``lane`` (dropped at start if it is a duplicate or stale).

    ``kind`` is informational (Flower shows it); the lane's own record decides what runs.
    """
    del kind
    report = executor().execute(str(lane), str(turn_id), task_id=self.request.id)
    if report.outcome == "error":
        raise TurnFailed.from_report(report)
    return report.outcome

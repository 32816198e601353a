"""Celery tasks: thin. Parse the message, call the core, report.

There is one turn task for every persona and kind (the queue carries the kind), so Flower and
metrics see one task name however large the fleet is.
"""

from __future__ import annotations

from typing import Any

from workers.celery import app
from workers.queues import TURN_TASK
from workers.runtime import executor

__all__ = ["turn"]


@app.task(
    name=TURN_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=0,
)
def turn(self: Any, lane: str, turn_id: str) -> str:
    """Run turn ``turn_id`` of ``lane`` (dropped at start if it is a duplicate or stale)."""
    report = executor().execute(str(lane), str(turn_id), task_id=self.request.id)
    return report.outcome

"""The real worker app plus one fault: SIGKILL itself after taking a turn message for the lane
named by ``CRASH_BEFORE_START_LANE`` and before the turn starts.

``celery -A tests.support.crash_app worker`` receives the message exactly as production does
(the broker has handed it over, Celery's ``task_received`` has fired), then dies in
``task_prerun``, before :meth:`workers.turn.TurnExecutor.execute` runs ``start``. That is the
window issue 10 names: the broker only redelivers after its visibility timeout.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from celery.signals import task_prerun

from workers.celery import app

__all__ = ["app"]

_LANE = os.environ.get("CRASH_BEFORE_START_LANE", "")


@task_prerun.connect
def _die_before_start(args: Any = None, **_: Any) -> None:
    if _LANE and args and str(args[0]) == _LANE:
        os.kill(os.getpid(), signal.SIGKILL)

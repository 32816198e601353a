"""A turn message lost in a dying worker, against real processes: how long until the lane runs.

Two workers serve the queue; one is ``celery -A tests.support.crash_app worker``, which SIGKILLs
itself after taking a turn message for the chosen lane and before the turn starts. Turns are
posted to that lane until the doomed worker is the one that takes a message; then the clock
runs from its death to the next ``turn.start`` of the lane (on the other worker, after beat's
recovery pass re-published it).
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.fleet import FleetProcess, read_events, start_worker, wait_until
from workers.fleet import Fleet

__all__ = ["lose_one_message"]


def _count(logs: Path, event: str, lane: str) -> int:
    return sum(
        1
        for path in logs.glob("*.log")
        for record in read_events(path, event)
        if record.get("lane") == lane
    )


def lose_one_message(
    fleet: Fleet,
    env: dict[str, str],
    logs: Path,
    *,
    lane: str,
    name: str,
    processes: list[FleetProcess],
    tries: int = 40,
) -> float:
    """Kill a worker holding ``lane``'s turn message before start; seconds until it runs.

    ``env`` must carry ``CRASH_BEFORE_START_LANE=lane``; beat must be running. A healthy
    worker must already serve the queue (it is the one that runs the re-published turn).
    """
    doomed = start_worker(env, logs, name=name, app="tests.support.crash_app")
    processes.append(doomed)
    for _ in range(tries):
        ended = _count(logs, "turn.end", lane)
        fleet.post(lane, "hello")

        def moved(ended: int = ended) -> bool:
            return doomed.popen.poll() is not None or _count(logs, "turn.end", lane) > ended

        wait_until(moved, timeout=30, interval=0.02, what="a turn or the crash")
        if doomed.popen.poll() is not None:
            break
    if doomed.popen.poll() is None:
        raise AssertionError(f"worker {name} never took a message for {lane}")
    died = time.monotonic()
    before = _count(logs, "turn.start", lane)
    wait_until(
        lambda: _count(logs, "turn.start", lane) > before,
        timeout=120,
        interval=0.02,
        what=f"{lane} to run again",
    )
    return time.monotonic() - died

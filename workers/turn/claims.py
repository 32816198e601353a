"""Claims taken when a turn message is received, before the pool runs it.

Celery's ``task_received`` hands the message to :meth:`Claims.receive`, which claims the lane in
Redis (``receive.lua``) and has the process's renewer keep the claim alive until the turn's
start replaces it with a lease (:meth:`drop`). A worker that dies in between leaves a claim that
lapses within seconds, and beat re-publishes the turn (:mod:`workers.fleet.recovery`), instead
of the lane waiting out the broker's visibility timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import structlog

from workers.fleet.errors import RedisUnavailable
from workers.fleet.lanes import Lanes
from workers.fleet.lease import ClaimHandle, Renewer
from workers.fleet.outcomes import StartOutcome
from workers.persona.clock import Clock, SystemClock

__all__ = ["START_REDIS_WAIT", "Claims", "waiting_for_redis"]

#: How long a turn's start waits for a Redis that is down (a restart, a failover) before the
#: task fails. The message is in this worker's hands: failing acknowledges it, and the lane
#: then waits for beat's reaper (SOULFLEET_REAP_QUEUED_AFTER, 10 minutes by default).
START_REDIS_WAIT = 60.0
_FIRST_PAUSE = 0.1

_log = structlog.get_logger("soulfleet.turn")

T = TypeVar("T")


def waiting_for_redis(
    step: Callable[[], T], *, clock: Clock, wait: float, event: str, **fields: object
) -> T:
    """``step()``, tried again while it raises :class:`RedisUnavailable` (a restart, a
    failover), for up to ``wait`` seconds; ``event`` is logged once, on the first refusal.

    For the turn's scripts that must not be given up on a Redis blip: its start (the message
    is in this worker's hands) and its end (finish, fail, defer: the model calls were paid
    for). Each is one atomic script, so a try that failed to connect changed nothing; one
    whose reply was lost ran, and its retry is refused by the lane's own checks (a start is
    answered ``duplicate``, an end ``lost``), never applied twice."""
    deadline = clock.monotonic() + wait
    pause = _FIRST_PAUSE
    while True:
        try:
            return step()
        except RedisUnavailable as exc:
            left = deadline - clock.monotonic()
            if left <= 0:
                raise
            if pause == _FIRST_PAUSE:  # once per call: 200 threads waiting log 200 lines
                _log.warning(event, error=str(exc)[:300], wait_s=round(left, 1), **fields)
            clock.sleep(min(pause, left))
            pause = min(pause * 2, 2.0)


class Claims:
    """The receive claims one worker process holds. Thread-safe."""

    def __init__(
        self,
        lanes: Lanes,
        renewer: Renewer,
        *,
        worker_id: str,
        ttl: float,
        clock: Clock | None = None,
        redis_wait: float = START_REDIS_WAIT,
    ) -> None:
        self.lanes = lanes
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.redis_wait = redis_wait
        self.renewer = renewer
        self.worker_id = worker_id
        self.ttl = ttl
        self._claims: dict[tuple[str, str], ClaimHandle] = {}
        self._lock = threading.Lock()

    def receive(self, lane: str, turn_id: str) -> bool:
        """Claim the lane on message receipt; its renewer keeps the claim alive until start.

        Never raises: a claim that could not be written only means a lost message is found
        by the slower ``SOULFLEET_REAP_QUEUED_AFTER`` path instead."""
        ttl = self.ttl
        try:
            claimed = self.lanes.receive(lane, turn_id, self.worker_id, ttl=ttl)
        except Exception as exc:
            _log.warning("turn.claim_failed", lane=lane, turn_id=turn_id, error=str(exc))
            return False
        if claimed:
            handle = ClaimHandle(self.lanes, lane, turn_id, ttl)
            with self._lock:
                self._claims[(lane, turn_id)] = handle
            try:
                self.renewer.register(handle)
            except RuntimeError as exc:  # shutting down: the claim lapses, beat re-publishes
                _log.warning("turn.claim_unrenewed", lane=lane, turn_id=turn_id, error=str(exc))
        return claimed

    def start(self, lane: str, turn_id: str) -> StartOutcome:
        """Start the turn (:meth:`Lanes.start`: the lease replaces the receive claim), waiting
        out a Redis that is down for up to ``redis_wait`` seconds; raises
        :class:`RedisUnavailable` once it has been down that long.

        Failing at once acknowledged the message during a Redis restart, and the lane waited
        ten minutes for the reaper. A start whose reply was lost (it ran) is answered
        ``duplicate`` by its retry: the lane's lease lapses and beat hands the turn on."""
        try:
            return waiting_for_redis(
                lambda: self.lanes.start(lane, turn_id, self.worker_id),
                clock=self.clock,
                wait=self.redis_wait,
                event="turn.start_waiting_for_redis",
            )
        finally:
            self.drop(lane, turn_id)

    def drop(self, lane: str, turn_id: str) -> None:
        with self._lock:
            handle = self._claims.pop((lane, turn_id), None)
        if handle is not None:
            handle.close()

"""Claims taken when a turn message is received, before the pool runs it.

Celery's ``task_received`` hands the message to :meth:`Claims.receive`, which claims the lane in
Redis (``receive.lua``) and has the process's renewer keep the claim alive until the turn's
start replaces it with a lease (:meth:`drop`). A worker that dies in between leaves a claim that
lapses within seconds, and beat re-publishes the turn (:mod:`workers.fleet.recovery`), instead
of the lane waiting out the broker's visibility timeout.
"""

from __future__ import annotations

import threading

import structlog

from workers.fleet.lanes import Lanes
from workers.fleet.lease import ClaimHandle, Renewer

__all__ = ["Claims"]

_log = structlog.get_logger("soulfleet.turn")


class Claims:
    """The receive claims one worker process holds. Thread-safe."""

    def __init__(self, lanes: Lanes, renewer: Renewer, *, worker_id: str, ttl: float) -> None:
        self.lanes = lanes
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

    def drop(self, lane: str, turn_id: str) -> None:
        with self._lock:
            handle = self._claims.pop((lane, turn_id), None)
        if handle is not None:
            handle.close()

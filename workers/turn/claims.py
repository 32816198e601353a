"""Claims taken when a turn message is received, before the pool runs it.

Celery's ``task_received`` hands the message to :meth:`Claims.receive`; the lane is claimed in
Redis (``receive.lua``) and the process's renewer keeps the claim alive until the turn's start
replaces it with a lease (:meth:`drop`). A worker that dies in between leaves a claim that
lapses within seconds, and beat re-publishes the turn (:mod:`workers.fleet.recovery`), instead
of the lane waiting out the broker's visibility timeout.

Why a claimer thread: ``task_received`` runs on the consumer's event loop, the one thread that
takes every message off the broker. A round trip there (and the wait for the GIL after it,
while pool threads run turns) held up the delivery of every message behind it, and bounded a
worker's turns per second. So :meth:`receive` only queues the claim; one thread per process
sends every claim queued meanwhile in ONE round trip (the batch is what piled up during the
previous round trip: no added delay when the worker is idle).

The price is a window of about one round trip after receipt in which the message is not yet
claimed: a worker killed inside it leaves its lane to the slower
``SOULFLEET_REAP_QUEUED_AFTER`` path, as a claim that failed always did. A claim that reaches
Redis after its turn started is refused by ``receive.lua`` (the lane is no longer queued with
that turn id), so a late claim never outlives its turn.
"""

from __future__ import annotations

import threading

import structlog

from workers.fleet.lanes import Lanes
from workers.fleet.lease import ClaimHandle, Renewer

__all__ = ["Claims"]

_log = structlog.get_logger("soulfleet.turn")

_Turn = tuple[str, str]


class Claims:
    """The receive claims one worker process holds. Thread-safe."""

    def __init__(self, lanes: Lanes, renewer: Renewer, *, worker_id: str, ttl: float) -> None:
        self.lanes = lanes
        self.renewer = renewer
        self.worker_id = worker_id
        self.ttl = ttl
        self._claims: dict[_Turn, ClaimHandle] = {}
        self._pending: dict[_Turn, None] = {}  # insertion-ordered set
        self._sending: set[_Turn] = set()
        self._dropped: set[_Turn] = set()  # dropped while their claim was on its way
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def receive(self, lane: str, turn_id: str) -> None:
        """Queue the claim of ``lane``'s turn for the claimer thread; never blocks or raises."""
        with self._cond:
            if self._closed:
                return
            self._pending[(lane, turn_id)] = None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="soulfleet-claims", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def drop(self, lane: str, turn_id: str) -> None:
        """The turn started (or was dropped at start): its claim, queued or held, ends."""
        key = (lane, turn_id)
        with self._cond:
            handle = self._claims.pop(key, None)
            if self._pending.pop(key, 0) is None:
                return  # never sent: nothing in Redis to end
            if key in self._sending:
                self._dropped.add(key)
        if handle is not None:
            handle.close()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every claim queued so far was answered by Redis (tests, shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._sending, timeout)

    def close(self) -> None:
        """Stop the claimer thread (queued claims are not sent; they would only lapse)."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._sending.update(batch)
            claimed = self._send(batch)
            with self._cond:
                for key, ok in zip(batch, claimed, strict=True):
                    self._sending.discard(key)
                    if key in self._dropped:
                        # Started meanwhile: its start deleted the claim, or the claim came
                        # late and was refused. Either way there is nothing to keep alive.
                        self._dropped.discard(key)
                    elif ok:
                        self._claims[key] = self._hold(*key)
                self._prune()
                self._cond.notify_all()

    def _send(self, batch: list[_Turn]) -> list[bool]:
        try:
            return self.lanes.receive_many(batch, self.worker_id, ttl=self.ttl)
        except Exception as exc:  # only means a lost message is found by the slower reap path
            _log.warning("turn.claim_failed", claims=len(batch), error=str(exc))
            return [False] * len(batch)

    def _hold(self, lane: str, turn_id: str) -> ClaimHandle:
        handle = ClaimHandle(self.lanes, lane, turn_id, self.ttl)
        try:
            self.renewer.register(handle)
        except RuntimeError as exc:  # shutting down: the claim lapses, beat re-publishes
            _log.warning("turn.claim_unrenewed", lane=lane, turn_id=turn_id, error=str(exc))
        return handle

    def _prune(self) -> None:
        # A claim whose turn another process started (a prefork pool receives in the parent
        # and starts in a child, so this process never drops it) ends when its renewal finds
        # the key gone; forget it then.
        gone = [key for key, handle in self._claims.items() if handle.lost.is_set()]
        for key in gone:
            del self._claims[key]

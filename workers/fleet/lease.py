"""Keeping what a worker holds alive: ONE renewer thread per process for every lease and slot.

A turn holds a lane lease (and, during a model call, a turn-gate slot); both expire unless
renewed, which is what frees them when a worker dies. Renewing from the turn's own thread
would stall exactly when the turn is stuck in a long model call, and a thread per turn does not
scale to a 32-thread pool, so one daemon thread renews every registered handle each
``interval`` (default ``lease_ttl / 3``, or ``gate_slot_ttl / 3`` if shorter: one slow round
trip never loses a live hold), one batched round trip per owner (a
:class:`~workers.fleet.lanes.Lanes` or a :class:`~workers.fleet.gate.Gate`).

A handle's :attr:`Held.lost` is set, for good, when a renewal finds the lease gone (its key
expired or was deleted, or another start or the reaper bumped the fence: a lapsed lease is
never taken back) or when renewals have failed for longer than the TTL
(Redis may have let it lapse, and someone else may own it now). A lost handle is never renewed
again. The turn executor calls :meth:`Held.check` before every write: a turn that lost its
lease stops before its next write.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self

import redis
import structlog

from workers.fleet.errors import FleetError, LeaseLost

if TYPE_CHECKING:
    from workers.fleet.lanes import Lanes

__all__ = ["ClaimHandle", "Held", "LeaseHandle", "Renewer"]

_log = structlog.get_logger("soulfleet.lease")

# A holder stops writing once this fraction of its TTL has passed without a successful
# renewal (renewals run every third of a TTL, so a healthy lease is never near it).
_UNPROVEN = 0.8


class Held(ABC):
    """Something a process holds in Redis with a TTL, kept alive by a :class:`Renewer`."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.lost = threading.Event()
        self.lost_reason = ""
        # Make the handle right after taking the hold: its TTL counts from about now.
        self._last_ok = time.monotonic()
        self._renewer: Renewer | None = None

    @property
    @abstractmethod
    def owner(self) -> object:
        """What renews this handle; handles of one owner are renewed in one round trip."""

    @classmethod
    @abstractmethod
    def renew_group(cls, handles: Sequence[Self]) -> list[bool]:
        """Renew handles that share one owner; one bool per handle (False = gone)."""

    @abstractmethod
    def check(self) -> None:
        """Raise if the hold is lost (call before every write)."""

    def mark_lost(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()
            _log.warning("lease.lost", held=repr(self), reason=reason)

    def _renewed(self, now: float) -> None:
        self._last_ok = now

    def _failed(self, now: float, error: str) -> None:
        if now - self._last_ok > self.ttl:
            self.mark_lost(f"renewals failed for {now - self._last_ok:.1f}s: {error}")

    def close(self) -> None:
        """Stop renewing this handle (it is then left to expire or be released)."""
        if self._renewer is not None:
            self._renewer.unregister(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LeaseHandle(Held):
    """A running turn's lane lease: ``(lane, fence)``."""

    def __init__(self, lanes: Lanes, lane: str, fence: int) -> None:
        super().__init__(lanes.lease_ttl)
        self.lanes = lanes
        self.lane = lane
        self.fence = fence

    def __repr__(self) -> str:
        return f"LeaseHandle(lane={self.lane!r}, fence={self.fence})"

    @property
    def owner(self) -> object:
        return self.lanes

    @classmethod
    def renew_group(cls, handles: Sequence[LeaseHandle]) -> list[bool]:
        return handles[0].lanes.renew_many([(h.lane, h.fence) for h in handles])

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the renewer found the lease gone, or if no renewal has
        succeeded for most of a TTL: the lease may already have expired in Redis (and the
        reaper handed the lane on), so a write now could overlap the next holder's."""
        if not self.lost.is_set():
            silent = time.monotonic() - self._last_ok
            if silent > self.ttl * _UNPROVEN:
                self.mark_lost(
                    f"no successful renewal for {silent:.1f}s of a {self.ttl:.0f}s lease"
                )
        if self.lost.is_set():
            raise LeaseLost(self.lane, self.fence, self.lost_reason)

    def holds(self) -> bool:
        """Ask Redis now (one round trip); a False answer also marks the handle lost."""
        if self.lost.is_set():
            return False
        if self.lanes.holds(self.lane, self.fence):
            return True
        self.mark_lost("Redis says the fence no longer holds the lane")
        return False


class ClaimHandle(Held):
    """A worker's receive claim on a lane (``receive.lua``), kept alive until the turn starts.

    Its lapse is how beat learns that the worker died holding the turn message
    (:mod:`workers.fleet.recovery`); there is nothing to check before a write."""

    def __init__(self, lanes: Lanes, lane: str, turn_id: str, ttl: float) -> None:
        super().__init__(ttl)
        self.lanes = lanes
        self.lane = lane
        self.turn_id = turn_id

    def __repr__(self) -> str:
        return f"ClaimHandle(lane={self.lane!r}, turn_id={self.turn_id!r})"

    @property
    def owner(self) -> object:
        return self.lanes

    @classmethod
    def renew_group(cls, handles: Sequence[ClaimHandle]) -> list[bool]:
        claims = [(h.lane, h.turn_id) for h in handles]
        return handles[0].lanes.renew_claims(claims, ttl=handles[0].ttl)

    def check(self) -> None:
        """A claim guards no write."""

    def mark_lost(self, reason: str) -> None:
        # Gone is the normal end of a claim (start deleted it, perhaps in another process of
        # a prefork pool): stop renewing it, quietly.
        self.lost_reason = reason
        self.lost.set()
        self.close()


class Renewer:
    """The process's one renewal thread. Thread-safe; started by the first registration.

    ``Renewer(lanes, interval=..., ttl=...)``: ``ttl`` defaults to ``lanes.lease_ttl`` and
    ``interval`` to ``ttl / 3``. A gate whose ``slot_ttl`` is shorter tightens the interval to
    ``slot_ttl / 3`` through :meth:`serve_ttl`, so slots never lapse between two passes.
    """

    def __init__(
        self,
        lanes: Lanes | None = None,
        *,
        ttl: float | None = None,
        interval: float | None = None,
    ) -> None:
        if ttl is None:
            if lanes is None:
                raise ValueError("Renewer needs lanes or an explicit ttl")
            ttl = lanes.lease_ttl
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0, got {ttl}")
        self.lanes = lanes
        self.interval = interval if interval is not None else ttl / 3
        if self.interval <= 0:
            raise ValueError(f"interval must be > 0, got {self.interval}")
        self._handles: dict[int, Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- registration -----------------------------------------------------------------------
    def serve_ttl(self, ttl: float) -> None:
        """Make sure passes come often enough for holds of ``ttl`` seconds (``ttl / 3``).

        A gate calls this with its slot TTL, so the gate knows the renewer and never the other
        way round."""
        with self._lock:
            self.interval = min(self.interval, ttl / 3)
        self._wake.set()  # a thread asleep on the old interval re-reads it now

    def register(self, handle: Held) -> Held:
        """Renew ``handle`` from now on (starts the thread if it is not running)."""
        with self._lock:
            if self._stop.is_set():
                raise RuntimeError("the renewer is stopped; make a new one")
            handle._renewer = self
            self._handles[id(handle)] = handle
        self.start()
        return handle

    def unregister(self, handle: Held) -> None:
        """Stop renewing ``handle`` (idempotent)."""
        with self._lock:
            self._handles.pop(id(handle), None)

    def register_lease(self, lane: str, fence: int, *, lanes: Lanes | None = None) -> LeaseHandle:
        """Register and return the lease of a started turn (usable as a context manager)."""
        owner = lanes or self.lanes
        if owner is None:
            raise ValueError("register_lease needs lanes (none were given to the Renewer)")
        handle = LeaseHandle(owner, lane, fence)
        self.register(handle)
        return handle

    def __len__(self) -> int:
        with self._lock:
            return len(self._handles)

    # -- the thread -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread (idempotent; a stopped renewer stays stopped)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="soulfleet-renewer", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (worker shutdown). Registered holds are left to expire."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._wake.wait(self.interval):
                self._wake.clear()
                continue
            try:
                self.renew_now()
            except Exception:  # the thread must outlive any one bad pass
                _log.exception("lease.renew_pass_failed")

    def renew_now(self) -> None:
        """One renewal pass over every live handle: one round trip per owner."""
        with self._lock:
            live = [h for h in self._handles.values() if not h.lost.is_set()]
        groups: dict[tuple[type[Held], int], list[Held]] = {}
        for handle in live:
            groups.setdefault((type(handle), id(handle.owner)), []).append(handle)
        for (kind, _), group in groups.items():
            # A renewal extends the TTL from when it was SENT: count from before the call.
            sent = time.monotonic()
            try:
                results = kind.renew_group(group)
            except (FleetError, redis.RedisError) as exc:
                _log.warning("lease.renew_failed", handles=len(group), error=str(exc))
                for handle in group:
                    handle._failed(time.monotonic(), str(exc))
                continue
            with self._lock:
                # A turn that committed while this pass was in flight deleted its own lease
                # and unregistered: "gone" is then its finish, not a loss.
                still = {id(handle) for handle in group if id(handle) in self._handles}
            for handle, ok in zip(group, results, strict=True):
                if ok:
                    handle._renewed(sent)
                elif id(handle) in still:
                    handle.mark_lost("renewal found it gone (fence moved on or slot expired)")

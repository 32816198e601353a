"""The running turn's time left, for what it calls: its tools and its model.

A turn has ``max_seconds`` (``SOULFLEET_TURN_MAX_SECONDS``). What it calls has timeouts of its
own (a tool's, the model client's per try, times its retries), which may be longer: the turn's
limit must hold anyway, or a tool or a provider that never answers keeps the lane past every
budget and the broker's redelivery. The loop sets the seconds left around each call; callees
shorten their own waits to it (:func:`bounded_timeout`).
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["bounded_timeout", "time_left"]

#: Seconds the running turn has left, while one of its tools or model calls runs; None outside
#: a turn.
_time_left: ContextVar[float | None] = ContextVar("soulfleet_turn_time_left", default=None)


def time_left() -> ContextVar[float | None]:
    """The context variable the turn loop sets around each tool call and model call."""
    return _time_left


def bounded_timeout(own: float) -> float:
    """``own`` (a timeout), or less when the running turn has less time left."""
    left = _time_left.get()
    return own if left is None else max(0.0, min(own, left))

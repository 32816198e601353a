"""The running turn's time left, for what it calls: its tools and its model.

A turn has ``max_seconds`` (``SOULFLEET_TURN_MAX_SECONDS``). What it calls has timeouts of its
own (a tool's, the model client's per try, times its retries, after a wait for a gate slot),
which may be longer: the turn's limit must hold anyway, or a tool or a provider that never
answers keeps the lane past every budget and the broker's redelivery. The loop sets the
turn's deadline around each call (:func:`turn_deadline`); callees shorten their own waits to
what is left of it when they wait (:func:`time_left`, :func:`bounded_timeout`).

The deadline is kept on this process's monotonic clock: the seconds left are read from the
turn's own clock when it is set, so a turn run on a virtual clock (tests) still bounds calls
that wait in real time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["bounded_timeout", "time_left", "turn_deadline"]

#: ``time.monotonic()`` by which the running turn must end, while one of its tools or model
#: calls runs; None outside a turn.
_deadline: ContextVar[float | None] = ContextVar("soulfleet_turn_deadline", default=None)


@contextlib.contextmanager
def turn_deadline(seconds_left: float) -> Iterator[None]:
    """Within: the running turn has ``seconds_left`` from now (never more than an enclosing
    deadline leaves)."""
    deadline = time.monotonic() + seconds_left
    outer = _deadline.get()
    token = _deadline.set(deadline if outer is None else min(deadline, outer))
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left() -> float | None:
    """Seconds the running turn has left now (may be negative); None outside a turn."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def bounded_timeout(own: float) -> float:
    """``own`` (a timeout), or less when the running turn has less time left."""
    left = time_left()
    return own if left is None else max(0.0, min(own, left))

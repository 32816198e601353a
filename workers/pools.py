"""The Celery pools a worker may run, and the most turns each may run at once.

Each limit is the concurrency that pool was shown to drain 1,000 turns at with no lane left
stuck (``python -m tests.bench.bench_pools``); a worker asked for more is refused at start,
naming the pool, the number asked for and the limit, instead of stalling later:

- ``threads`` (the default) and ``gevent``: turns wait on model calls, so a slot is a waiting
  thread or greenlet; up to :data:`IO_POOL_MAX`.
- ``prefork``: one process per slot, each a full interpreter (~80 MB); a slot costs a core's
  worth of memory for a task that waits, so the limit is two processes per core.
- ``solo``: runs one turn at a time in the worker's own thread, whatever ``-c`` says.
"""

from __future__ import annotations

import importlib.util
import os

__all__ = [
    "IO_POOL_MAX",
    "POOLS",
    "SPARE_CONNECTIONS",
    "connections_for",
    "effective_concurrency",
    "missing_package",
    "pool_limit",
    "refusal",
]

POOLS = ("threads", "gevent", "prefork", "solo")
IO_POOL_MAX = 1000
#: Redis connections a process keeps beyond one per pool slot: the consumer's own, the lease
#: renewer, a beat or CLI command in the same process.
SPARE_CONNECTIONS = 16


def connections_for(concurrency: int) -> int:
    """How many Redis connections a pool of ``concurrency`` slots may hold at once: every slot
    may ack, publish or run a script at the same moment (the broker's and the fleet's pools)."""
    return concurrency + SPARE_CONNECTIONS


def missing_package(pool: str) -> str | None:
    """Why ``pool`` cannot run here (its package is not installed), or None."""
    if pool == "gevent" and importlib.util.find_spec("gevent") is None:
        return (
            "gevent is not installed: install it (pip install 'soulfleet[gevent]') or use the "
            "threads pool, which serves as many turns at once"
        )
    return None


def pool_limit(pool: str, cpu_count: int | None = None) -> int:
    """The most turns ``pool`` is allowed to run at once on a machine of ``cpu_count`` cores."""
    if pool in ("threads", "gevent"):
        return IO_POOL_MAX
    if pool == "prefork":
        return 2 * max(1, cpu_count if cpu_count is not None else (os.cpu_count() or 1))
    return 1


def effective_concurrency(pool: str, concurrency: int) -> int:
    """How many turns ``pool`` really runs at once when asked for ``concurrency``."""
    return 1 if pool == "solo" else concurrency


def refusal(pool: str, concurrency: int, cpu_count: int | None = None) -> str | None:
    """Why a worker of ``pool`` x ``concurrency`` must not start, or None when it may."""
    if pool not in POOLS:
        return f"pool {pool!r} is not one of {', '.join(POOLS)}"
    limit = pool_limit(pool, cpu_count)
    if pool != "solo" and concurrency > limit:
        return (
            f"{pool} pool at concurrency {concurrency} is above its limit of {limit} "
            f"(the most it drains turns at with no lane stuck); lower -c / "
            "SOULFLEET_WORKER_CONCURRENCY or run more worker processes"
        )
    return None

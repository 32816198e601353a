"""A worker process's long-lived parts, built once and shared by every pool thread.

One Redis connection pool, one lease :class:`~workers.fleet.lease.Renewer` thread, one
:class:`~workers.fleet.gate.Gate` and one :class:`~workers.turn.TurnExecutor` per process. Prefork
children call :func:`reset_runtime` after the fork (connections and threads do not survive one).
"""

from __future__ import annotations

import os
import threading
import uuid

import structlog
from celery import Celery

from workers import metric_files, metrics
from workers.fleet import Fleet
from workers.fleet.gate import Gate
from workers.fleet.lease import Renewer
from workers.persona.locks import set_lock_wait_observer
from workers.persona.loop import set_tool_call_observer
from workers.persona.memory import set_write_failure_observer
from workers.persona.waits import set_wait_hook
from workers.publisher import CeleryPublisher
from workers.settings import Settings
from workers.turn import TurnExecutor

__all__ = [
    "build_executor",
    "configure",
    "executor",
    "receive",
    "reset_runtime",
    "start_worker_services",
    "stop_worker_services",
]

_log = structlog.get_logger("soulfleet.runtime")


class _Holder:
    """The process's one executor (a class attribute rather than a module global)."""

    lock = threading.Lock()
    executor: TurnExecutor | None = None
    settings: Settings | None = None
    app: Celery | None = None


def configure(settings: Settings, app: Celery) -> None:
    """The settings and Celery app this process's executor is built from (on first use)."""
    with _Holder.lock:
        _Holder.settings, _Holder.app, _Holder.executor = settings, app, None


def _build(settings: Settings, app: Celery) -> TurnExecutor:
    return build_executor(settings, Fleet(settings, publisher=CeleryPublisher(settings, app)))


def build_executor(settings: Settings, fleet: Fleet) -> TurnExecutor:
    """A worker's executor over ``fleet``: its lease renewer (started) and turn gate."""
    renewer = Renewer(fleet.lanes, interval=settings.lease_renew_every, ttl=settings.lease_ttl)
    renewer.serve_ttl(settings.claim_ttl)
    gate = Gate(
        fleet.client,
        fleet.keys,
        limit=settings.max_concurrent_model_calls,
        slot_ttl=settings.gate_slot_ttl,
        renewer=renewer,
        clock=fleet.clock,
    )
    renewer.start()
    worker_id = f"{settings.hostname}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    return TurnExecutor(settings, fleet, renewer, gate, worker_id=worker_id)


def executor() -> TurnExecutor:
    """This process's executor, built on first use from the Celery app's settings."""
    with _Holder.lock:
        if _Holder.executor is None:
            if _Holder.settings is None or _Holder.app is None:
                raise RuntimeError("workers.runtime is not configured: import workers.celery first")
            _Holder.executor = _build(_Holder.settings, _Holder.app)
        return _Holder.executor


def receive(lane: str, turn_id: str) -> None:
    """A turn message reached this worker: claim its lane (see TurnExecutor.receive)."""
    executor().receive(lane, turn_id)


def reset_runtime() -> None:
    with _Holder.lock:
        _Holder.executor = None


def install_observers() -> None:
    """Count memory-lock waits, memory-write failures and tool calls in this process's
    metrics. A worker installs them before its pool starts (``worker_init``): a prefork pool's
    first children are forked before the worker is ready, and counted none of them."""
    set_lock_wait_observer(metrics.MEMORY_LOCK_WAIT.observe)
    set_write_failure_observer(metrics.observe_memory_failure)
    set_tool_call_observer(metrics.observe_tool_call)


def start_worker_services(
    settings: Settings, *, pool: str | None = None, concurrency: int | None = None
) -> None:
    """Metrics endpoint, the observers (again: :func:`install_observers`); then warm the
    executor."""
    install_observers()
    metrics.serve_metrics(settings.metrics_port, host=settings.metrics_host)
    built = executor()
    pool = pool or settings.worker_pool
    concurrency = concurrency or settings.worker_concurrency
    # Threads of one process are what fight over the GIL; a prefork or solo process runs one
    # turn at a time, and gevent's greenlets hand over only where they wait anyway.
    baton = settings.turn_baton and pool == "threads" and concurrency > 1
    built.baton.enable(baton)
    set_wait_hook(built.baton.released if baton else None)
    files = {"metric_files": os.environ[metric_files.ENV]} if metric_files.shared() else {}
    _log.info("worker.ready", pool=pool, concurrency=concurrency, baton=baton, **files)
    if pool == "prefork" and settings.metrics_port and not metric_files.shared():
        # Turns run (and count themselves) in the pool's child processes; this endpoint is the
        # parent's, and the children's metric files could not be shared with it (workers.celery
        # was not the first to import the metrics). Said at start, or a dashboard of zeros
        # reads as an idle fleet.
        _log.warning(
            "metrics.prefork_blind",
            port=settings.metrics_port,
            problem="the prefork pool runs turns in child processes this endpoint does not "
            "see: turns, model calls, tokens and tool calls stay 0 here, and this worker's "
            "turns are missing from the alerts and dashboards built on them",
            hint="start it as `celery -A workers worker` (soulfleet's metrics were imported "
            "before workers.celery, too late to share the children's metric files), or use "
            "the threads pool",
        )


def stop_worker_services() -> None:
    """Stop renewing leases and close every MCP session (no tool server outlives its worker)."""
    with _Holder.lock:
        current = _Holder.executor
    if current is not None:
        current.renewer.stop()
        current.tool_hub.close()

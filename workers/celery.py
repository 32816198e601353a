"""The Celery app of a worker or beat process (``celery -A workers`` finds ``workers.celery.app``).

Built once from the one :class:`~workers.settings.Settings` object by
:func:`workers.app.make_app` (where each configuration choice is explained); this module adds the
process signals: logging, and the worker's long-lived parts (:mod:`workers.runtime`), which get
this app and these settings passed in rather than importing them back.
"""

from __future__ import annotations

from typing import Any

from celery.signals import (
    beat_init,
    setup_logging,
    task_received,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from workers import runtime
from workers.app import make_app
from workers.fleet.eviction import refuse_to_start_on_eviction
from workers.logs import configure_logging
from workers.queues import TURN_TASK
from workers.settings import Settings

__all__ = ["app", "make_app", "settings"]

settings = Settings.from_env()
app = make_app(settings)
runtime.configure(settings, app)


@setup_logging.connect
def _setup_logging(**_: Any) -> None:
    # Connecting this signal stops Celery from installing its own handlers over ours.
    configure_logging(settings.log_format, settings.log_level)


@beat_init.connect
def _beat_init(**_: Any) -> None:
    configure_logging(settings.log_format, settings.log_level)


@worker_init.connect
def _worker_init(**_: Any) -> None:
    # Before the pool starts or a message is taken: never run turns on an evicting Redis.
    configure_logging(settings.log_format, settings.log_level)
    refuse_to_start_on_eviction(settings, "worker")


@worker_process_init.connect
def _worker_process_init(**_: Any) -> None:
    # Prefork children: a fresh runtime per process (connections must not cross a fork).
    runtime.reset_runtime()


@task_received.connect
def _task_received(request: Any = None, **_: Any) -> None:
    # At receipt, before the pool runs the task: a worker that dies from here on leaves a
    # claim that lapses within seconds (workers/fleet/recovery.py), not a lane stuck queued.
    if request is None or getattr(request, "name", None) != TURN_TASK:
        return
    args: list[Any] = list(getattr(request, "args", None) or ())
    if len(args) >= 2:
        runtime.receive(str(args[0]), str(args[1]))


@worker_ready.connect
def _worker_ready(sender: Any = None, **_: Any) -> None:
    # -P/-c on the command line override the settings: report what the pool really is.
    pool = getattr(sender, "pool", None)
    module = type(pool).__module__.rsplit(".", 1)[-1] if pool is not None else None
    runtime.start_worker_services(
        settings,
        pool={"thread": "threads"}.get(module or "", module),
        concurrency=getattr(pool, "limit", None),
    )


@worker_shutdown.connect
def _worker_shutdown(**_: Any) -> None:
    runtime.stop_worker_services()


@worker_process_shutdown.connect
def _worker_process_shutdown(**_: Any) -> None:
    # Prefork children have their own runtime (and MCP servers): close theirs as they exit.
    runtime.stop_worker_services()

"""The Celery app of a worker or beat process (``celery -A workers`` finds ``workers.celery.app``).

Built once from the one :class:`~workers.settings.Settings` object by
:func:`workers.app.make_app` (where each configuration choice is explained); this module adds the
process signals: logging, and the worker's long-lived parts (:mod:`workers.runtime`), which get
this app and these settings passed in rather than importing them back.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

# First: a prefork worker names its metric files before anything imports prometheus_client.
from workers.process_settings import pool_asked, settings, settings_or_exit  # isort: split

import structlog
from celery.signals import (
    beat_init,
    celeryd_init,
    setup_logging,
    task_received,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from workers import runtime
from workers.app import broker_pools, make_app
from workers.fleet.eviction import refuse_to_start_on_eviction
from workers.logs import configure_logging
from workers.persona.shared_claims import check_hard_links
from workers.pools import effective_concurrency, refusal
from workers.queues import TURN_TASK, unknown_queues

__all__ = ["app", "make_app", "pool_asked", "settings", "settings_or_exit"]

_log = structlog.get_logger("soulfleet.worker")
#: EX_CONFIG from sysexits.h, as for an evicting Redis: the setup is wrong, not the program.
_EX_CONFIG = 78


app = make_app(settings)
runtime.configure(settings, app)


@setup_logging.connect
def _setup_logging(**_: Any) -> None:
    # Connecting this signal stops Celery from installing its own handlers over ours.
    configure_logging(settings.log_format, settings.log_level)


def pool_name(pool: Any) -> str | None:
    """``threads``, ``gevent``, ``prefork`` or ``solo`` for a Celery pool class or instance."""
    if pool is None:
        return None
    if isinstance(pool, str):  # a programmatic Worker(pool="solo"): the name itself
        return "threads" if pool in ("thread", "threads") else pool
    cls = pool if isinstance(pool, type) else type(pool)
    module = cls.__module__.rsplit(".", 1)[-1]
    return {"thread": "threads"}.get(module, module)


@celeryd_init.connect
def _celeryd_init(conf: Any = None, options: Any = None, **_: Any) -> None:
    # -P/-c on the command line override the settings: check and size for what was asked,
    # before the worker opens a single broker connection.
    options = options or {}
    # Celery's command line hands the pool over as "pool" (a class); "pool_cls" is the
    # programmatic name. Reading only the latter checked every worker as the settings' pool.
    pool = pool_name(options.get("pool_cls") or options.get("pool")) or settings.worker_pool
    concurrency = int(options.get("concurrency") or settings.worker_concurrency)
    refused = refusal(pool, concurrency) or unknown_queues(
        settings.queue_prefix, options.get("queues")
    )
    if refused is not None:
        # Celery logs and swallows an Exception raised by a signal handler; SystemExit stops it
        # (EX_CONFIG, as for an evicting Redis: the setup is wrong, not the program).
        _log.error("worker.refused", pool=pool, concurrency=concurrency, reason=refused)
        sys.stderr.write(f"soulfleet worker refused to start: {refused}\n")
        raise SystemExit(_EX_CONFIG)
    threads = effective_concurrency(pool, concurrency)
    if threads != settings.worker_concurrency or pool != settings.worker_pool:
        # The worker's own Redis clients are sized from the runtime's settings (one connection
        # per pool thread): give it the pool this worker really runs, not the environment's.
        runtime.configure(
            dataclasses.replace(settings, worker_pool=pool, worker_concurrency=threads), app
        )
    if conf is not None:
        pools = broker_pools(settings.broker_url, threads)
        conf.broker_pool_limit = pools["broker_pool_limit"]
        if "max_connections" in pools:
            conf.broker_transport_options = {
                **conf.broker_transport_options,
                "max_connections": pools["max_connections"],
            }


@beat_init.connect
def _beat_init(**_: Any) -> None:
    configure_logging(settings.log_format, settings.log_level)


@worker_init.connect
def _worker_init(**_: Any) -> None:
    # Before the pool starts or a message is taken: never run turns on an evicting Redis.
    configure_logging(settings.log_format, settings.log_level)
    runtime.install_observers()  # before a prefork pool forks its children
    refuse_to_start_on_eviction(settings, "worker")
    if settings.lock_mode == "shared" and (problem := check_hard_links(settings.personas)):
        _log.error("locks.no_hard_links", personas=str(settings.personas), error=problem)
        print(f"soulfleet worker: refusing to start: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(_EX_CONFIG)


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
    runtime.start_worker_services(
        settings, pool=pool_name(pool), concurrency=getattr(pool, "limit", None)
    )


@worker_shutdown.connect
def _worker_shutdown(**_: Any) -> None:
    runtime.stop_worker_services()


@worker_process_shutdown.connect
def _worker_process_shutdown(**_: Any) -> None:
    # Prefork children have their own runtime (and MCP servers): close theirs as they exit.
    runtime.stop_worker_services()

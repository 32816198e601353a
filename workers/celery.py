"""The Celery app (``celery -A workers …`` finds ``workers.celery.app`` by Celery's convention).

Configured from the one :class:`~workers.settings.Settings` object. Each choice answers a known
trap of Celery's Redis transport (see the README's architecture section):

- ``task_acks_late`` + ``task_reject_on_worker_lost``: a SIGKILLed worker's turn is not lost. A
  turn that always crashes would then loop forever, so lanes count attempts and dead-letter.
- ``worker_prefetch_multiplier=1`` and a ``visibility_timeout`` well above the longest turn: the
  Redis broker redelivers unacked messages after it, counted from delivery, even while the task
  still runs. Turn start rejects duplicates anyway.
- ``worker_cancel_long_running_tasks_on_connection_loss``: a worker that lost the broker stops
  its turns instead of finishing work whose message will be redelivered elsewhere.
- JSON only, results ignored: turns report through Redis lanes, never through a result backend.
- Thread pool by default: turns wait on model calls (I/O), so 32 threads serve 32 turns where a
  prefork pool of 2 would serve 2.
- Task events on, so Flower shows the fleet.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import (
    beat_init,
    setup_logging,
    worker_process_init,
    worker_ready,
    worker_shutdown,
)

from workers.logs import configure_logging
from workers.queues import declare_queues, queue_name
from workers.settings import Settings

__all__ = ["app", "make_app", "settings"]


def make_app(settings: Settings) -> Celery:
    celery_app = Celery("soulfleet", broker=settings.broker_url, include=["workers.tasks"])
    transport_options: dict[str, Any] = {}
    if settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
        transport_options = {
            "visibility_timeout": settings.visibility_timeout,
            "global_keyprefix": f"{settings.key_prefix}broker:",
        }
    celery_app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport_options,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        task_queues=declare_queues(settings.queue_prefix),
        task_default_queue=queue_name(settings.queue_prefix, "interactive"),
        task_default_exchange=settings.queue_prefix,
        task_default_routing_key=queue_name(settings.queue_prefix, "interactive"),
        worker_pool=settings.worker_pool,
        worker_concurrency=settings.worker_concurrency,
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        enable_utc=True,
        timezone="UTC",
        beat_scheduler="beat.scheduler:FleetScheduler",
        beat_max_loop_interval=max(0.1, min(settings.sweep_interval, 5.0)),
    )
    return celery_app


settings = Settings.from_env()
app = make_app(settings)


@setup_logging.connect
def _setup_logging(**_: Any) -> None:
    # Connecting this signal stops Celery from installing its own handlers over ours.
    configure_logging(settings.log_format, settings.log_level)


@beat_init.connect
def _beat_init(**_: Any) -> None:
    configure_logging(settings.log_format, settings.log_level)


@worker_process_init.connect
def _worker_process_init(**_: Any) -> None:
    # Prefork children: a fresh runtime per process (connections must not cross a fork).
    from workers.runtime import reset_runtime  # noqa: PLC0415 - runtime imports this module

    reset_runtime()


@worker_ready.connect
def _worker_ready(sender: Any = None, **_: Any) -> None:
    from workers.runtime import start_worker_services  # noqa: PLC0415 - as above

    # -P/-c on the command line override the settings: report what the pool really is.
    pool = getattr(sender, "pool", None)
    module = type(pool).__module__.rsplit(".", 1)[-1] if pool is not None else None
    start_worker_services(
        settings,
        pool={"thread": "threads"}.get(module or "", module),
        concurrency=getattr(pool, "limit", None),
    )


@worker_shutdown.connect
def _worker_shutdown(**_: Any) -> None:
    from workers.runtime import stop_worker_services  # noqa: PLC0415 - as above

    stop_worker_services()

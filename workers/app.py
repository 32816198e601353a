"""How a soulfleet Celery app is configured: :func:`make_app`, a pure factory.

:mod:`workers.celery` builds THE app of a worker or beat process with it; a host that publishes
turns (:class:`~workers.publisher.CeleryPublisher`) builds its own from its settings.
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
- Thread pool by default: turns wait on model calls (I/O), so 200 threads serve 200 turns where
  a prefork pool of 2 would serve 2.
- Broker connection pools sized to the pool's concurrency (:func:`broker_pools`): kombu's Redis
  transport allows 10 connections by default and *raises* when an 11th ack or publish needs
  one, which stalled a gevent worker at ``-c 1000`` with ~200 lanes left running.
- The Redis transport is kombu's with one client object per channel (:mod:`workers.broker`):
  stock kombu builds a new client for every ack and every delivered message's bookkeeping.
- Task events only when ``SOULFLEET_TASK_EVENTS`` is on (compose and ``up --flower`` turn it on,
  because Flower needs them): otherwise every turn would pay a PUBLISH for each of its sent,
  received, started and succeeded events, about an eighth of a worker's CPU per turn.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from workers import broker
from workers.pools import connections_for
from workers.queues import declare_queues, queue_name
from workers.settings import Settings

__all__ = ["broker_pools", "make_app"]


def broker_pools(broker_url: str, concurrency: int) -> dict[str, Any]:
    """Celery settings that let ``concurrency`` pool slots ack and publish at the same time.

    Every slot may ack its message (acks_late) and publish a follow-up at once: the Redis
    transport's ``max_connections`` and Celery's ``broker_pool_limit`` (producers) must both
    cover them, or kombu raises ``MaxConnectionsError`` mid-ack and the turn's lane stays
    ``running`` until the reaper finds it. Connections are opened on demand, not up front.
    """
    size = connections_for(concurrency)
    pools: dict[str, Any] = {"broker_pool_limit": size}
    if broker.is_redis(broker_url):
        pools["max_connections"] = size
    return pools


def make_app(settings: Settings) -> Celery:
    broker.install()
    celery_app = Celery("soulfleet", broker=settings.broker_url, include=["workers.tasks"])
    pools = broker_pools(settings.broker_url, settings.worker_concurrency)
    transport_options: dict[str, Any] = {}
    if broker.is_redis(settings.broker_url):
        transport_options = {
            "visibility_timeout": settings.visibility_timeout,
            "global_keyprefix": f"{settings.key_prefix}broker:",
            "max_connections": pools["max_connections"],
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
        broker_pool_limit=pools["broker_pool_limit"],
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        task_queues=declare_queues(settings.queue_prefix),
        task_default_queue=queue_name(settings.queue_prefix, "interactive"),
        task_default_exchange=settings.queue_prefix,
        task_default_routing_key=queue_name(settings.queue_prefix, "interactive"),
        worker_pool=settings.worker_pool,
        worker_concurrency=settings.worker_concurrency,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        enable_utc=True,
        timezone="UTC",
        beat_scheduler="beat.scheduler:FleetScheduler",
        beat_max_loop_interval=max(0.1, min(settings.sweep_interval, 5.0)),
    )
    return celery_app

"""A Celery app with one no-op task, for ``bench_fleet``'s bare-Celery baseline.

Run:  celery -A tests.bench.noop_app worker   (with the same environment as a fleet worker)

The app is :func:`workers.app.make_app` of :meth:`Settings.from_env`, so the worker gets
exactly the fleet's configuration: broker and key prefix, queues, prefetch 1, ``acks_late`` +
``reject_on_worker_lost``, results ignored, JSON only, task events on, the thread pool and its
concurrency. Importing :mod:`workers.celery` also connects the fleet's worker signals (JSON
logging, ``worker.ready``, the lease renewer), so the baseline pays what a fleet worker pays
around a task, and the benchmark waits for the same ``worker.ready`` event.

The task lives here and not in ``workers/``: a no-op has no place in production code. It is
registered on this app only (``shared=False``), under :data:`NOOP_TASK`, with the turn task's
options. Its body is one Redis ``INCR`` of :func:`done_key`: the benchmark counts completions
there (one local round trip per task, which a turn's own Redis calls dwarf), instead of parsing
the worker's log or needing a result backend the fleet does not configure.
"""

from __future__ import annotations

import threading

import redis
from celery import Celery

from workers.app import make_app
from workers.settings import Settings

__all__ = ["NOOP_TASK", "app", "done_key", "make_noop_app", "settings"]

NOOP_TASK = "soulfleet.bench.noop"


def done_key(settings: Settings) -> str:
    """The counter every executed no-op task increments (under the run's key prefix)."""
    return f"{settings.key_prefix}bench:noop:done"


def make_noop_app(settings: Settings) -> Celery:
    """The fleet's app for ``settings`` plus the no-op task (the benchmark publishes with it)."""
    celery_app = make_app(settings)
    key = done_key(settings)
    lock = threading.Lock()
    clients: list[redis.Redis] = []

    def client() -> redis.Redis:
        # One pooled client per process, built on first use: pool threads share it.
        with lock:
            if not clients:
                clients.append(redis.Redis.from_url(settings.redis_url))
            return clients[0]

    @celery_app.task(
        name=NOOP_TASK,
        shared=False,
        acks_late=True,
        reject_on_worker_lost=True,
        ignore_result=True,
        max_retries=0,
    )
    def noop() -> None:
        """Do nothing but count the execution."""
        client().incr(key)

    return celery_app


settings = Settings.from_env()
app = make_noop_app(settings)

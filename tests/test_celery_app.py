"""workers/celery.py: the app carries the settings that answer Celery's known traps."""

from __future__ import annotations

from workers.app import make_app
from workers.settings import Settings


def test_app_configuration_answers_the_known_traps() -> None:
    """acks_late + reject_on_worker_lost, prefetch 1, JSON only, results ignored, broker keys
    namespaced, a visibility timeout above the longest turn, thread pool of 200, task events
    off unless asked for, and the fleet's own beat scheduler."""
    settings = Settings.from_env({"SOULFLEET_KEY_PREFIX": "fx:", "SOULFLEET_QUEUE_PREFIX": "fx"})
    conf = make_app(settings).conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.accept_content == ["json"]
    assert conf.task_serializer == "json"
    assert conf.task_ignore_result is True
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is True
    assert conf.broker_transport_options["global_keyprefix"] == "fx:broker:"
    assert conf.broker_transport_options["visibility_timeout"] == settings.visibility_timeout
    assert settings.visibility_timeout > 2 * settings.turn_max_seconds
    assert conf.worker_pool == "threads"
    assert conf.worker_concurrency == 200
    assert conf.worker_send_task_events is False
    assert conf.task_send_sent_event is False
    assert conf.beat_scheduler == "beat.scheduler:FleetScheduler"
    assert [q.name for q in conf.task_queues] == ["fx.interactive", "fx.heartbeat", "fx.dream"]


def test_a_non_redis_broker_gets_no_redis_transport_options() -> None:
    """RabbitMQ works too: no Redis-only options are passed to its transport."""
    settings = Settings.from_env({"CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"})
    assert make_app(settings).conf.broker_transport_options == {}


def test_task_events_are_opt_in_for_flower() -> None:
    """SOULFLEET_TASK_EVENTS=1 turns Celery's task events (and sent events) on, for Flower."""
    conf = make_app(Settings.from_env({"SOULFLEET_TASK_EVENTS": "1"})).conf
    assert conf.worker_send_task_events is True
    assert conf.task_send_sent_event is True


def test_broker_pools_cover_the_concurrency() -> None:
    """Every pool slot can ack and publish at once: the Redis transport's max_connections and
    the producer pool are both above the worker's concurrency."""
    settings = Settings.from_env({"SOULFLEET_WORKER_CONCURRENCY": "700"})
    conf = make_app(settings).conf
    assert conf.broker_transport_options["max_connections"] > 700
    assert conf.broker_pool_limit > 700

"""workers/celery.py: the app carries the settings that answer Celery's known traps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fleet import REPO
from workers.app import make_app
from workers.queues import unknown_queues
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


def test_a_command_line_concurrency_sizes_the_workers_redis_clients() -> None:
    """`-c 500` on the command line (above the settings' 200): the worker's coordination
    client holds a connection for each of its 500 threads, not the settings' 216."""
    from celery.concurrency.thread import TaskPool  # noqa: PLC0415

    from workers import celery as worker_app  # noqa: PLC0415
    from workers import runtime  # noqa: PLC0415
    from workers.pools import SPARE_CONNECTIONS  # noqa: PLC0415

    options = {"concurrency": 500, "pool_cls": TaskPool}  # what `-P threads -c 500` passes
    try:
        worker_app._celeryd_init(conf=None, options=options)
        client = runtime.executor().fleet.client
        assert client.connection_pool.max_connections == 500 + SPARE_CONNECTIONS
    finally:
        runtime.stop_worker_services()
        runtime.configure(worker_app.settings, worker_app.app)
    assert runtime.executor().fleet.client.connection_pool.max_connections == (
        worker_app.settings.worker_concurrency + SPARE_CONNECTIONS
    )
    runtime.stop_worker_services()
    runtime.reset_runtime()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("pool", "concurrency", "reason"),
    [
        ("threads", "1001", "threads pool at concurrency 1001 is above its limit of 1000"),
        # Celery took the configured threads pool for `-P prefork` without a word, so the
        # prefork limit was never checked either.
        ("prefork", "100000", "prefork pool at concurrency 100000 is above its limit"),
    ],
)
def test_a_worker_above_its_pools_limit_is_refused_at_start(
    tmp_path: Path, pool: str, concurrency: str, reason: str
) -> None:
    """`celery -A workers worker -P <pool> -c <above its limit>` (the command line overriding
    the settings) exits at once with a non-zero status and the reason, before taking any work:
    the pool checked is the one the command line asked for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOULFLEET_", "CELERY_"))}
    env.update(REDIS_URL="redis://127.0.0.1:1/0", SOULFLEET_PERSONAS=str(tmp_path))
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-P", pool,
            "-c", concurrency, "--without-mingle", "--without-gossip"]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=str(REPO), capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode != 0
    assert "refused to start" in done.stderr
    assert reason in done.stderr


@pytest.mark.parametrize(
    ("argv", "asked"),
    [
        (["celery", "-A", "workers", "worker", "-P", "prefork", "-c", "2"], "prefork"),
        (["celery", "worker", "--pool=prefork"], "prefork"),
        (["celery", "worker", "--pool", "gevent"], "gevent"),
        (["celery", "worker", "-Psolo"], "solo"),
        (["celery", "-A", "workers", "worker", "-c", "8"], None),
    ],
)
def test_the_pool_a_command_line_asks_for_is_read(argv: list[str], asked: str | None) -> None:
    """Every way Celery's command line names a pool is read (`-P prefork` must win over the
    configured threads pool: Celery cannot tell it from its own default)."""
    from workers.celery import pool_asked  # noqa: PLC0415

    assert pool_asked(argv) == asked


def test_a_prefork_command_line_gets_preforks_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`-P prefork` with neither SOULFLEET_WORKER_POOL nor SOULFLEET_WORKER_CONCURRENCY set:
    the worker's settings are prefork's, its concurrency prefork's per-core default (it was
    the threads default of 200, and the worker refused to start above prefork's limit)."""
    from workers import celery as worker_app  # noqa: PLC0415
    from workers.pools import pool_limit  # noqa: PLC0415

    for name in ("SOULFLEET_WORKER_POOL", "SOULFLEET_WORKER_CONCURRENCY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["celery", "-A", "workers", "worker", "-P", "prefork"])
    asked = worker_app.settings_or_exit()
    assert asked.worker_pool == "prefork"
    assert 1 <= asked.worker_concurrency <= pool_limit("prefork")
    monkeypatch.setattr(sys, "argv", ["celery", "-A", "workers", "worker", "-P", "processes"])
    assert worker_app.settings_or_exit().worker_pool == "prefork"  # Celery's other name for it
    monkeypatch.setattr(sys, "argv", ["celery", "-A", "workers", "worker"])
    assert worker_app.settings_or_exit().worker_pool == "threads"


@pytest.mark.integration
def test_a_worker_asked_for_a_queue_no_turn_is_sent_to_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """`-Q soulfleet.interactive,soulfleet.drem` (a typo) started and consumed nothing from the
    typo'd queue, so those turns waited for ever: it exits at once naming the unknown queue
    and the fleet's three."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOULFLEET_", "CELERY_"))}
    env.update(REDIS_URL="redis://127.0.0.1:1/0", SOULFLEET_PERSONAS=str(tmp_path))
    queues = "soulfleet.interactive,soulfleet.drem"
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", queues,
            "--without-mingle", "--without-gossip"]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=str(REPO), capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 78  # EX_CONFIG, as for the other setup refusals
    assert "refused to start" in done.stderr
    assert "no soulfleet turn is sent to: 'soulfleet.drem'" in done.stderr
    assert "soulfleet.interactive, soulfleet.heartbeat, soulfleet.dream" in done.stderr


def test_the_fleets_own_queues_are_never_refused() -> None:
    """Any subset of the three queues, given as -Q's string or list, or none at all, passes."""
    assert unknown_queues("soulfleet", None) is None
    assert unknown_queues("soulfleet", "soulfleet.dream") is None
    assert unknown_queues("sf", ["sf.interactive", "sf.heartbeat", "sf.dream"]) is None
    assert unknown_queues("sf", ["soulfleet.dream"]) is not None

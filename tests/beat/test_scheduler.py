"""beat/scheduler.py: sweep, sync and reap run inside beat; other entries are still published."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from celery.schedules import schedule
from prometheus_client import REGISTRY

import beat.scheduler
from beat.scheduler import REAP, RECOVER, SWEEP, SYNC, FleetScheduler
from tests.beat.conftest import Events
from tests.support.beat import lane_ticks, write_persona
from workers.app import make_app
from workers.fleet.keys import Keys
from workers.local.redis_server import RedisServer
from workers.metrics import LaneStateCollector
from workers.settings import Settings

EVERY_1S = '[heartbeat]\nevery = "1s"\n'


@pytest.fixture
def env(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str, persona_root: Path
) -> Settings:
    """The environment beat reads its Settings from: this test's Redis, prefix and personas."""
    values = {
        "REDIS_URL": redis_url,
        "SOULFLEET_KEY_PREFIX": key_prefix,
        "SOULFLEET_QUEUE_PREFIX": key_prefix.rstrip(":").replace(":", "-"),
        "SOULFLEET_PERSONAS": str(persona_root),
        "SOULFLEET_SWEEP_INTERVAL": "0.5",
        "SOULFLEET_SYNC_INTERVAL": "7",
        "SOULFLEET_REAP_INTERVAL": "11",
        "SOULFLEET_METRICS_PORT": "0",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return Settings.from_env()


@pytest.fixture
def app(env: Settings) -> Iterator[Celery]:
    made = make_app(env)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def collectors(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[LaneStateCollector]]:
    """Give the test its own once-per-process metrics slot and unregister what it registered."""
    registered: list[LaneStateCollector] = []
    monkeypatch.setattr(beat.scheduler, "_collectors", registered)
    yield registered
    for collector in registered:
        REGISTRY.unregister(collector)


def broker_depth(client: redis.Redis, settings: Settings, queue: str) -> int:
    """Messages waiting in a broker queue (kombu's Redis list under the fleet's key prefix)."""
    return int(client.llen(f"{settings.key_prefix}broker:{queue}"))


def test_the_schedule_has_the_three_in_process_entries(
    app: Celery, env: Settings, collectors: list[LaneStateCollector], redis_client: redis.Redis
) -> None:
    """Sweep, sync, reap and recover are beat entries at the configured intervals."""
    scheduler = FleetScheduler(app=app)
    intervals: dict[str, float] = {}
    for name in (SWEEP, SYNC, REAP, RECOVER):
        every = scheduler.schedule[name].schedule
        assert isinstance(every, schedule)
        assert scheduler.schedule[name].task == name
        intervals[name] = every.seconds  # total seconds, fractions kept
    assert intervals == {SWEEP: 0.5, SYNC: 7.0, REAP: 11.0, RECOVER: 1.0}


def test_sync_runs_once_at_start(
    app: Celery,
    env: Settings,
    persona_root: Path,
    collectors: list[LaneStateCollector],
    redis_client: redis.Redis,
) -> None:
    """A fresh beat schedules the fleet before its first sweep."""
    write_persona(persona_root, "ava", EVERY_1S)
    FleetScheduler(app=app)
    keys = Keys(env.key_prefix)
    assert redis_client.zscore(keys.schedule, "ava|heartbeat") is not None


def test_lazy_instances_touch_nothing(
    app: Celery,
    env: Settings,
    persona_root: Path,
    collectors: list[LaneStateCollector],
    redis_client: redis.Redis,
) -> None:
    """`celery beat` builds a lazy scheduler for its banner: no sync, no metrics, no Redis."""
    write_persona(persona_root, "ava", EVERY_1S)
    scheduler = FleetScheduler(app=app, lazy=True)
    assert "sweep every 0.5s" in scheduler.info
    assert redis_client.exists(Keys(env.key_prefix).schedule) == 0
    assert collectors == []


def test_the_sweep_runs_in_process_and_publishes_turns_not_itself(
    app: Celery,
    env: Settings,
    persona_root: Path,
    collectors: list[LaneStateCollector],
    redis_client: redis.Redis,
) -> None:
    """Applying the sweep entry ticks due lanes here; the only broker message is the turn."""
    write_persona(persona_root, "ava", EVERY_1S)
    scheduler = FleetScheduler(app=app)
    keys = Keys(env.key_prefix)
    redis_client.zadd(keys.schedule, {"ava|heartbeat": 0})  # due now
    scheduler.apply_entry(scheduler.schedule[SWEEP], producer=None)
    assert lane_ticks(redis_client, keys, ["ava"]) == {"ava": 1}
    heartbeat_queue = f"{env.queue_prefix}.heartbeat"
    assert broker_depth(redis_client, env, heartbeat_queue) == 1
    message = json.loads(str(redis_client.lindex(f"{env.key_prefix}broker:{heartbeat_queue}", 0)))
    assert message["headers"]["task"] == "soulfleet.turn"
    assert broker_depth(redis_client, env, f"{env.queue_prefix}.interactive") == 0
    last = json.loads(str(redis_client.get(keys.last_sweep)))
    assert last["emitted"] == 1


def test_other_beat_entries_are_still_published(
    app: Celery,
    env: Settings,
    collectors: list[LaneStateCollector],
    redis_client: redis.Redis,
) -> None:
    """A user's own beat_schedule entry goes to the broker as usual."""
    app.conf.beat_schedule = {
        "user.report": {"task": "user.report", "schedule": 60.0, "options": {"queue": "userq"}}
    }
    scheduler = FleetScheduler(app=app)
    assert set(scheduler.schedule) >= {SWEEP, SYNC, REAP, "user.report"}
    scheduler.apply_entry(scheduler.schedule["user.report"], producer=scheduler.producer)
    assert broker_depth(redis_client, env, "userq") == 1


def test_a_failing_sweep_is_logged_and_the_next_one_runs(
    *,
    app: Celery,
    env: Settings,
    persona_root: Path,
    collectors: list[LaneStateCollector],
    redis_client: redis.Redis,
    events: Events,
) -> None:
    """An exception inside one pass never escapes beat; the following pass works."""
    write_persona(persona_root, "ava", EVERY_1S)
    scheduler = FleetScheduler(app=app)
    keys = Keys(env.key_prefix)
    saved = redis_client.dump(keys.schedule)
    assert isinstance(saved, bytes)
    redis_client.delete(keys.schedule)
    redis_client.set(keys.schedule, "not a sorted set")  # every sweep command now fails
    scheduler.apply_entry(scheduler.schedule[SWEEP], producer=None)
    [failed] = events.named("beat.task_failed")
    assert failed["task"] == SWEEP
    assert "WRONGTYPE" in failed["error"]
    redis_client.delete(keys.schedule)
    redis_client.restore(keys.schedule, 0, saved)
    redis_client.zadd(keys.schedule, {"ava|heartbeat": 0})
    scheduler.apply_entry(scheduler.schedule[SWEEP], producer=None)
    assert lane_ticks(redis_client, keys, ["ava"]) == {"ava": 1}


def test_a_full_redis_fails_a_pass_in_one_line_naming_it(
    *,
    monkeypatch: pytest.MonkeyPatch,
    env: Settings,
    persona_root: Path,
    collectors: list[LaneStateCollector],
    events: Events,
    tmp_path: Path,
) -> None:
    """Redis at its maxmemory refuses every sweep, once a second: each failure is logged as
    RedisFull, saying Redis is full and what to do (it was a raw OutOfMemoryError with a
    traceback per pass, ~33 log lines a second); a failure that is not Redis's keeps its
    traceback."""
    write_persona(persona_root, "ava", EVERY_1S)
    with RedisServer(tmp_path / "redis") as server:
        monkeypatch.setenv("REDIS_URL", server.url)
        full_app = make_app(Settings.from_env())
        client = redis.Redis.from_url(server.url)
        try:
            scheduler = FleetScheduler(app=full_app)
            client.config_set("maxmemory", 1)
            scheduler.apply_entry(scheduler.schedule[SWEEP], producer=None)
            [failed] = events.named("beat.task_failed")
            assert failed["task"] == SWEEP
            assert failed["error"].startswith("RedisFull: Redis at ")
            assert "CONFIG SET maxmemory" in failed["error"]
        finally:
            client.config_set("maxmemory", 0)
            client.close()
            full_app.close()


def test_lane_gauges_are_registered_once(
    app: Celery,
    env: Settings,
    persona_root: Path,
    collectors: list[LaneStateCollector],
    redis_client: redis.Redis,
) -> None:
    """Beat registers the lane-state collector once per process; idle counts registered lanes."""
    write_persona(persona_root, "ava", EVERY_1S)
    write_persona(persona_root, "bob", EVERY_1S)
    FleetScheduler(app=app)
    FleetScheduler(app=app)
    assert len(collectors) == 1
    assert REGISTRY.get_sample_value("soulfleet_lanes", {"state": "idle"}) == 2.0
    assert REGISTRY.get_sample_value("soulfleet_dead_lettered_lanes") == 0.0


def test_an_evicting_policy_set_while_beat_runs_is_reported_every_sync(
    *,
    app: Celery,
    persona_root: Path,
    collectors: list[LaneStateCollector],
    redis_client: redis.Redis,
    events: Events,
) -> None:
    """beat refused an evicting Redis at start; a CONFIG SET to allkeys-lru while it runs is
    logged at error level (redis.evicting_policy, naming the policy) on every sync pass, and
    the clock keeps running (stopping beat would stop every persona). Its metrics say so too
    (soulfleet_redis_evicting_policy 1, for the alert), and 0 again once it is set back."""
    write_persona(persona_root, "ava", EVERY_1S)
    scheduler = FleetScheduler(app=app)
    assert events.named("redis.evicting_policy") == []
    assert REGISTRY.get_sample_value("soulfleet_redis_evicting_policy") == 0.0
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        scheduler.apply_entry(scheduler.schedule[SYNC], producer=None)
        scheduler.apply_entry(scheduler.schedule[SWEEP], producer=None)
        assert REGISTRY.get_sample_value("soulfleet_redis_evicting_policy") == 1.0
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
    assert REGISTRY.get_sample_value("soulfleet_redis_evicting_policy") == 0.0
    [logged] = events.named("redis.evicting_policy")
    assert logged["log_level"] == "error"
    assert logged["policy"] == "allkeys-lru"
    assert "maxmemory-policy allkeys-lru" in logged["error"]
    assert events.named("beat.task_failed") == []

"""workers/settings.py: one frozen settings object; bad values fail loudly, naming the variable."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from workers.broker_urls import redis_py_url
from workers.persona.errors import SettingsError
from workers.settings import Settings, redact_url


def test_defaults_need_no_environment() -> None:
    """With nothing set, a fleet runs: local Redis, ./personas, thread pool, built-in model."""
    settings = Settings.from_env({})
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.broker_url == settings.redis_url
    assert not settings.redis_url_explicit
    assert settings.personas == Path("personas")
    assert settings.worker_pool == "threads"
    assert settings.model.default_spec == ""
    assert settings.lease_renew_every == settings.lease_ttl / 3
    assert (settings.reply_max_bytes, settings.beat_max_bytes) == (256 * 1024, 4096)
    assert settings.allow_eviction is False


def test_values_are_read_and_the_object_is_frozen() -> None:
    """Every variable lands in its field; the result cannot be changed afterwards."""
    settings = Settings.from_env(
        {
            "REDIS_URL": "redis://h:1/2",
            "CELERY_BROKER_URL": "amqp://guest@mq//",
            "SOULFLEET_PERSONAS": "/srv/personas",
            "SOULFLEET_INBOX_MAX": "5",
            "SOULFLEET_LOCK_MODE": "SHARED",
            "SOULFLEET_LOG_FORMAT": "json",
            "SOULFLEET_METRICS_PORT": "9808",
            "SOULFLEET_HEARTBEAT_JITTER": "0.25",
        }
    )
    assert settings.redis_url_explicit
    assert settings.broker_url == "amqp://guest@mq//"
    assert settings.personas == Path("/srv/personas")
    assert settings.inbox_max == 5
    assert settings.lock_mode == "shared"
    assert settings.log_format == "json"
    assert settings.metrics_port == 9808
    assert settings.heartbeat_jitter == 0.25
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.inbox_max = 6  # type: ignore[misc]


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("SOULFLEET_INBOX_MAX", "lots", "whole number"),
        ("SOULFLEET_INBOX_MAX", "0", ">= 1"),
        ("SOULFLEET_LEASE_TTL", "nan", "must be a finite duration"),
        ("SOULFLEET_LOCK_MODE", "nfs", "one of local, shared"),
        ("SOULFLEET_WORKER_POOL", "eventlet", "one of threads"),
        ("SOULFLEET_METRICS_PORT", "70000", "TCP port"),
        ("SOULFLEET_HEARTBEAT_JITTER", "0.9", "between 0 and 0.5"),
        ("REDIS_URL", "http://x", "redis://"),
        ("REDIS_URL", "redis://127.0.0.1:notaport/0", "Port could not be cast to integer"),
        ("REDIS_URL", "redis://127.0.0.1:99999/0", "Port out of range"),
        ("REDIS_URL", "redis://[::1/0", "Invalid IPv6 URL"),
        ("REDIS_URL", "redis://127.0.0.1:6379/x", "names database 'x'"),
        ("REDIS_URL", "unix:///tmp/r.sock?db=x", "Invalid value for 'db'"),
        ("REDIS_URL", "redis://h/0?socket_timeout=soon", "Invalid value for 'socket_timeout'"),
        # let through by redis-py's parser, refused by its connection at the first command
        ("REDIS_URL", "redis://:pw@127.0.0.1:6379/0?foo=1", "unexpected keyword argument 'foo'"),
        # the fleet's blocking pool takes it, but the CLI's reads and kombu crashed on it
        ("REDIS_URL", "redis://127.0.0.1:6379/0?timeout=5", "unexpected keyword argument"),
        ("REDIS_URL", "redis://127.0.0.1:6379/0?protocol=9", "protocol must be either 2 or 3"),
        ("CELERY_BROKER_URL", "redis://127.0.0.1:abc/0", "Port could not be cast to integer"),
        ("CELERY_BROKER_URL", "redis://127.0.0.1:6379/x", "names database 'x'"),
        ("CELERY_BROKER_URL", "unix:///tmp/r.sock?db=x", "Invalid value for 'db'"),
        ("CELERY_BROKER_URL", "amqp://guest@127.0.0.1:abc//", "Port could not be cast"),
        ("CELERY_BROKER_URL", "sentinel://h1:26379;sentinel://h2:x", "Port could not be cast"),
        ("CELERY_BROKER_URL", "redis://a:6379/0;redis://b:6379/y", "names database 'y'"),
        # kombu took these for hosts or schemes of nothing: a worker retried amqp://guest@bogus
        ("CELERY_BROKER_URL", "bogus", "is not a broker URL (bogus): its scheme must name"),
        ("CELERY_BROKER_URL", "http://x:1/0", "is not a broker URL"),
        ("CELERY_BROKER_URL", "redis://a:6379/0;bogus://b", "is not a broker URL (bogus://b)"),
        ("SOULFLEET_KEY_PREFIX", "a b", "white space"),
        ("SOULFLEET_MODEL_TIMEOUT", "soon", "duration such as"),
        ("SOULFLEET_RETRY_FOR", "six hours", "duration such as"),
        ("SOULFLEET_RETRY_FOR", "0.5s", "duration >= 1s"),
        ("SOULFLEET_RETRY_MAX", "infh", "duration"),
        ("SOULFLEET_RETRY_MAX", "1s", "at least SOULFLEET_RETRY_BASE (2s), got 1s"),
        ("SOULFLEET_CLAIM_TTL", "0", "duration >= 1s"),
        ("SOULFLEET_BREAKER_FAILURE_RATIO", "1.5", "fraction in (0, 1]"),
        ("SOULFLEET_BREAKER_MIN_CALLS", "0", ">= 1"),
        ("SOULFLEET_REPLY_MAX_BYTES", "100", ">= 1024"),
        ("SOULFLEET_BEAT_MAX_BYTES", "big", "whole number"),
        ("SOULFLEET_ALLOW_EVICTION", "maybe", "true or false"),
        ("SOULFLEET_HEARTBEAT_MODEL", "gpt-4o-mini", "model spec such as 'openai:<model>'"),
        ("SOULFLEET_DREAM_MODEL", "claude:x", "model spec"),
        ("SOULFLEET_DAILY_TOKENS", "-5", ">= 0"),
        ("SOULFLEET_DAILY_TOKENS", "lots", "whole number"),
        ("SOULFLEET_USAGE_DAYS", "0", ">= 1"),
    ],
)
def test_a_bad_value_fails_loudly_naming_the_variable(variable: str, value: str, says: str) -> None:
    """Nothing falls back silently: the error names the variable and what is wrong."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({variable: value})
    assert caught.value.variable == variable
    assert variable in str(caught.value)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("REDIS_URL", "redis://127.0.0.1:6379/3"),
        ("REDIS_URL", "redis://127.0.0.1:6379"),
        ("REDIS_URL", "redis://127.0.0.1:6379/"),
        ("REDIS_URL", "rediss://user:p%2Fss@cache.example:6380/0?ssl_cert_reqs=none"),
        ("REDIS_URL", "redis://[::1]:6379/0"),
        ("REDIS_URL", "unix:///run/redis.sock?db=2"),
        ("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
        ("CELERY_BROKER_URL", "sentinel://h1:26379;sentinel://h2:26379"),
        ("CELERY_BROKER_URL", "sentinel://:pw@h1:26379;sentinel://:pw@h2:26379"),
        ("CELERY_BROKER_URL", "redis://:pw@a:6379/0;redis://:pw@b:6379/0"),
        ("CELERY_BROKER_URL", "redis://a:6379/0;redis://b:6379/0"),
        ("CELERY_BROKER_URL", "unix:///run/redis.sock?db=2"),
    ],
)
def test_good_redis_and_broker_urls_pass(variable: str, value: str) -> None:
    """What the URL checks let through: every form the README names (TLS options, IPv6, a
    Unix socket, a percent-encoded password, RabbitMQ for the broker)."""
    settings = Settings.from_env({variable: value})
    # The broker's is held in kombu's spelling (redis+socket:// for a socket): spelled back.
    got = settings.redis_url if variable == "REDIS_URL" else redis_py_url(settings.broker_url)
    assert got == value


def test_a_retry_base_over_the_default_cap_says_the_cap_is_its_default() -> None:
    """SOULFLEET_RETRY_BASE=10m alone: the error is about SOULFLEET_RETRY_MAX, which the user
    never set, so it says its 300s is the default and both ways out."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"SOULFLEET_RETRY_BASE": "10m"})
    message = str(caught.value)
    assert "got 300s (its default: it is not set)" in message
    assert "raise SOULFLEET_RETRY_MAX or lower SOULFLEET_RETRY_BASE" in message


def test_visibility_timeout_must_outlast_the_longest_turn() -> None:
    """A visibility timeout under twice the worst turn would let the broker redeliver turns
    that are still running: refused at start-up. The default follows the turn budget."""
    with pytest.raises(SettingsError, match="SOULFLEET_VISIBILITY_TIMEOUT") as caught:
        Settings.from_env(
            {"SOULFLEET_VISIBILITY_TIMEOUT": "600", "SOULFLEET_TURN_MAX_SECONDS": "600",
             "SOULFLEET_MODEL_TIMEOUT": "100", "SOULFLEET_MODEL_RETRIES": "1"}
        )  # fmt: skip
    # The longest turn (600 + 100 x 2 = 800 s) and the least allowed (1600 s), told apart.
    assert "must be at least 1600s, twice the longest a turn can run (800s: " in str(caught.value)
    long_turns = Settings.from_env(
        {"SOULFLEET_TURN_MAX_SECONDS": "3600", "SOULFLEET_MODEL_TIMEOUT": "60"}
    )
    worst = 3600 + 60 * (long_turns.model.retries + 1)
    assert long_turns.visibility_timeout >= 2 * worst


def test_repr_never_shows_a_password_or_key() -> None:
    """A settings object can be logged whole: URLs are redacted, API keys hidden."""
    settings = Settings.from_env(
        {"REDIS_URL": "redis://:hunter2@h:6379/0", "OPENAI_API_KEY": "sk-very-secret"}
    )
    shown = repr(settings)
    assert "hunter2" not in shown
    assert "sk-very-secret" not in shown
    assert "redis://:***@h:6379/0" in shown


def test_redact_url_keeps_everything_but_the_password() -> None:
    """User, host, port, path and query survive; only the password is replaced."""
    assert redact_url("redis://user:pw@host:1/2?x=y") == "redis://user:***@host:1/2?x=y"
    assert redact_url("redis://host:1/0") == "redis://host:1/0"


def test_retry_and_breaker_durations_read_units() -> None:
    """Durations take a unit (ms, s, m, h, d) or plain seconds; the defaults are 6h, 5m, 2s."""
    settings = Settings.from_env(
        {
            "SOULFLEET_RETRY_FOR": "90m",
            "SOULFLEET_RETRY_BASE": "500ms",
            "SOULFLEET_RETRY_MAX": "2m",
            "SOULFLEET_BREAKER_WINDOW": "45",
            "SOULFLEET_BREAKER_PROBE_INTERVAL": "1d",
        }
    )
    assert (settings.retry_for, settings.retry_base, settings.retry_max) == (5400.0, 0.5, 120.0)
    assert (settings.breaker_window, settings.breaker_probe_interval) == (45.0, 86400.0)
    defaults = Settings.from_env({})
    assert (defaults.retry_for, defaults.retry_max, defaults.retry_base) == (21600.0, 300.0, 2.0)
    assert (defaults.claim_ttl, defaults.recover_interval) == (6.0, 1.0)


@pytest.mark.parametrize(
    ("variable", "field"),
    [
        ("SOULFLEET_TURN_MAX_SECONDS", "turn_max_seconds"),
        ("SOULFLEET_LEASE_TTL", "lease_ttl"),
        ("SOULFLEET_GATE_SLOT_TTL", "gate_slot_ttl"),
        ("SOULFLEET_REPLY_TTL", "reply_ttl"),
        ("SOULFLEET_LOCK_TIMEOUT", "lock_timeout"),
        ("SOULFLEET_SWEEP_INTERVAL", "sweep_interval"),
        ("SOULFLEET_SYNC_INTERVAL", "sync_interval"),
        ("SOULFLEET_REAP_INTERVAL", "reap_interval"),
        ("SOULFLEET_REAP_QUEUED_AFTER", "reap_queued_after"),
        ("SOULFLEET_RECOVER_INTERVAL", "recover_interval"),
        ("SOULFLEET_DREAM_WINDOW", "dream_window"),
    ],
)
def test_every_setting_in_seconds_reads_units(variable: str, field: str) -> None:
    """A setting in seconds takes a unit as the persona files' durations do (``1h`` for
    SOULFLEET_DREAM_WINDOW was refused as "not a number" while ``dream.window = "1h"`` worked)."""
    assert getattr(Settings.from_env({variable: "20m"}), field) == 1200.0
    assert getattr(Settings.from_env({variable: "1200"}), field) == 1200.0


def test_model_timeout_and_visibility_read_units() -> None:
    """The model timeout and the visibility timeout take units too."""
    settings = Settings.from_env(
        {"SOULFLEET_MODEL_TIMEOUT": "2m", "SOULFLEET_VISIBILITY_TIMEOUT": "1d"}
    )
    assert (settings.model.timeout, settings.visibility_timeout) == (120.0, 86400.0)


def test_io_concurrency_by_default() -> None:
    """A worker runs 200 turns at once by default, and the fleet-wide turn gate's default
    does not bind a single default host below that."""
    settings = Settings.from_env({})
    assert settings.worker_pool == "threads"
    assert settings.worker_concurrency >= 200
    assert settings.max_concurrent_model_calls >= settings.worker_concurrency
    assert settings.task_events is False


@pytest.mark.parametrize(
    ("pool", "concurrency"), [("threads", "1001"), ("gevent", "5000"), ("prefork", "100000")]
)
def test_concurrency_above_a_pools_limit_is_refused(
    pool: str, concurrency: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool asked for more than it was shown to drain safely fails at start, naming why."""
    _gevent_installed(monkeypatch, installed=True)
    env = {"SOULFLEET_WORKER_POOL": pool, "SOULFLEET_WORKER_CONCURRENCY": concurrency}
    with pytest.raises(SettingsError, match=r"SOULFLEET_WORKER_CONCURRENCY.*above its limit"):
        Settings.from_env(env)


def _gevent_installed(monkeypatch: pytest.MonkeyPatch, *, installed: bool) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name == "gevent":
            return ModuleSpec("gevent", None) if installed else None
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_the_gevent_pool_without_gevent_is_refused_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SOULFLEET_WORKER_POOL=gevent without gevent installed stops at start with what to do,
    not a ModuleNotFoundError traceback from the worker later."""
    _gevent_installed(monkeypatch, installed=False)
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"SOULFLEET_WORKER_POOL": "gevent"})
    assert caught.value.variable == "SOULFLEET_WORKER_POOL"
    assert "gevent is not installed" in str(caught.value)
    assert "soulfleet[gevent]" in str(caught.value)
    _gevent_installed(monkeypatch, installed=True)
    assert Settings.from_env({"SOULFLEET_WORKER_POOL": "gevent"}).worker_pool == "gevent"


def test_prefork_and_solo_default_to_what_they_can_run() -> None:
    """Without SOULFLEET_WORKER_CONCURRENCY, prefork gets its per-core limit (not 200
    processes) and solo its one turn at a time; both start without an error."""
    prefork = Settings.from_env({"SOULFLEET_WORKER_POOL": "prefork"})
    assert 1 <= prefork.worker_concurrency <= 2 * (os.cpu_count() or 1)
    assert Settings.from_env({"SOULFLEET_WORKER_POOL": "solo"}).worker_concurrency == 1


def test_spend_settings() -> None:
    """Per-kind model defaults ("inherit" = none), the fleet budget (unset = none) and the
    usage retention are read once."""
    assert Settings().daily_tokens is None
    settings = Settings.from_env(
        {
            "SOULFLEET_HEARTBEAT_MODEL": "openai:small",
            "SOULFLEET_DREAM_MODEL": "inherit",
            "SOULFLEET_DAILY_TOKENS": "200000",
            "SOULFLEET_USAGE_DAYS": "7",
        }
    )
    assert (settings.heartbeat_model, settings.dream_model) == ("openai:small", "")
    assert (settings.daily_tokens, settings.usage_days) == (200000, 7)


@pytest.mark.parametrize("url", ["REDIS://127.0.0.1:6379/0", "AMQP://guest@mq//", "pyamqp://mq//"])
def test_a_broker_url_of_a_transport_kombu_has_is_taken_in_any_case(url: str) -> None:
    """kombu connects with an upper-case scheme: the start-up check of the scheme (refusing
    `bogus`, which kombu took for a host) must not refuse it."""
    settings = Settings.from_env({"CELERY_BROKER_URL": url, "REDIS_URL": "redis://h:6379/0"})
    assert settings.broker_url

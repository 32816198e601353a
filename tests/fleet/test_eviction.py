"""workers/fleet/eviction.py: no fleet process runs on a Redis that may evict its keys.

Each test runs its own redis-server (the suite's shared one must stay noeviction) and sets the
policy with CONFIG SET, as an operator's redis.conf would.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import structlog
from structlog.testing import LogCapture

import workers.fleet.eviction
from tests.support.cli import run_soulfleet
from tests.support.fleet import REPO, fleet_env
from workers.fleet.errors import EvictingRedis
from workers.fleet.eviction import (
    EXIT_EVICTING,
    check_eviction_policy,
    refuse_to_start_on_eviction,
)
from workers.local.redis_server import RedisServer
from workers.settings import Settings


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, redis.Redis]]:
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            yield server.url, client
        finally:
            client.close()


@pytest.mark.parametrize(
    "policy", ["allkeys-lru", "allkeys-random", "volatile-lru", "volatile-ttl"]
)
def test_every_evicting_policy_is_refused_with_a_message_naming_the_setting(
    own_redis: tuple[str, redis.Redis], policy: str
) -> None:
    """allkeys-* AND volatile-* are refused (soulfleet's TTL keys are leases, gate slots and
    awaited replies: exactly what must not vanish); the message names maxmemory-policy, the
    policy found and both ways out."""
    url, client = own_redis
    client.config_set("maxmemory-policy", policy)
    with pytest.raises(EvictingRedis) as raised:
        check_eviction_policy(client, allow=False, url=url, process="worker")
    message = str(raised.value)
    assert f"maxmemory-policy {policy}" in message
    assert "noeviction" in message
    assert "SOULFLEET_ALLOW_EVICTION=1" in message


def test_noeviction_passes(own_redis: tuple[str, redis.Redis]) -> None:
    """The one safe policy is accepted and returned."""
    url, client = own_redis
    assert check_eviction_policy(client, allow=False, url=url, process="beat") == "noeviction"


def test_the_override_runs_but_logs_loudly(
    own_redis: tuple[str, redis.Redis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SOULFLEET_ALLOW_EVICTION lets it run, with an error-level redis.eviction_allowed line."""
    url, client = own_redis
    client.config_set("maxmemory-policy", "allkeys-lru")
    capture = LogCapture()
    logger = structlog.wrap_logger(
        None,
        processors=[structlog.processors.add_log_level, capture],
        cache_logger_on_first_use=False,
    )
    monkeypatch.setattr(workers.fleet.eviction, "_log", logger)
    assert check_eviction_policy(client, allow=True, url=url, process="up") == "allkeys-lru"
    [line] = capture.entries
    assert line["event"] == "redis.eviction_allowed"
    assert line["log_level"] == "error"
    assert line["policy"] == "allkeys-lru"


@pytest.mark.integration
def test_worker_and_beat_refuse_to_start_on_allkeys_lru(
    own_redis: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    """Real `celery -A workers worker` and `celery -A workers beat` against allkeys-lru: both
    exit with status 78 and a message naming maxmemory-policy, before taking a message or
    writing a schedule entry."""
    url, client = own_redis
    client.config_set("maxmemory-policy", "allkeys-lru")
    root = tmp_path / "personas"
    (root / "ava").mkdir(parents=True)
    (root / "ava" / "persona.toml").write_text('[heartbeat]\nevery = "1s"\n')
    env = fleet_env(redis_url=url, key_prefix="evict:", personas=root)
    celery = [sys.executable, "-m", "celery", "-A", "workers"]
    for argv in (
        [*celery, "worker", "-P", "threads", "-c", "2", "--without-mingle", "--without-gossip"],
        [*celery, "beat"],
    ):
        done = subprocess.run(
            argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == EXIT_EVICTING, done.stderr[-2000:]
        assert "refusing to start" in done.stderr
        assert "maxmemory-policy allkeys-lru" in done.stderr
    assert client.dbsize() == 0  # nothing scheduled, no broker key: it never started


@pytest.mark.integration
def test_up_refuses_an_evicting_redis_before_starting_any_child(
    own_redis: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    """`soulfleet up` with REDIS_URL at an allkeys-lru Redis exits 1 naming the setting, and
    starts no worker or beat (their logs are never created)."""
    url, client = own_redis
    client.config_set("maxmemory-policy", "allkeys-lru")
    data = tmp_path / "data"
    env: dict[str, str | None] = {"REDIS_URL": url, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    done = run_soulfleet("up", "--data", str(data), env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "maxmemory-policy allkeys-lru" in done.stderr
    assert not list(data.rglob("worker-*.log"))
    assert not list(data.rglob("beat.log"))


def test_a_worker_or_beat_on_a_database_redis_lacks_refuses_to_start(
    own_redis: tuple[str, redis.Redis], capsys: pytest.CaptureFixture[str]
) -> None:
    """REDIS_URL=.../99 on a Redis with 16 databases: the start-up check exits 78 saying
    which database and what to use. Celery swallowed the ResponseError of this worker_init
    check and started the worker anyway, retrying the database forever (beat: a traceback)."""
    url, _client = own_redis
    settings = Settings.from_env({"REDIS_URL": url.rsplit("/", 1)[0] + "/99"})
    with pytest.raises(SystemExit) as caught:
        refuse_to_start_on_eviction(settings, "worker")
    assert caught.value.code == 78
    err = capsys.readouterr().err
    assert "refusing to start: Redis refused the database that REDIS_URL selects" in err
    assert "/99" in err


@pytest.mark.integration
def test_worker_and_beat_refuse_to_start_on_a_refused_password_and_up_says_so(
    tmp_path: Path,
) -> None:
    """A Redis with requirepass, REDIS_URL without the password or with a wrong one: a real
    worker and beat exit 78 saying to check the password (they logged "check that it runs"
    once, then Celery retried "Authentication required." forever), and `up` on it says the
    credentials were refused instead of "start that Redis"."""
    with RedisServer(tmp_path / "redis", password="s3cretpw") as server:
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        celery = [sys.executable, "-m", "celery", "-A", "workers"]
        for url in (f"redis://127.0.0.1:{port}/0", f"redis://:wrongpw@127.0.0.1:{port}/0"):
            env = fleet_env(redis_url=url, key_prefix="auth:", personas=tmp_path)
            for argv in (
                [*celery, "worker", "-P", "threads", "-c", "2", "--without-mingle",
                 "--without-gossip"],
                [*celery, "beat"],
            ):  # fmt: skip
                done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                                      timeout=120, check=False)  # fmt: skip
                assert done.returncode == EXIT_EVICTING, done.stderr[-2000:]
                assert "refused this process's credentials" in done.stderr
                assert "check the password" in done.stderr
                assert "wrongpw" not in done.stderr
        up = run_soulfleet("up", "--data", str(tmp_path / "data"), "--personas", str(tmp_path),
                           env={"REDIS_URL": f"redis://127.0.0.1:{port}/0",
                                "XDG_DATA_HOME": str(tmp_path / "xdg")}, timeout=120)  # fmt: skip
        assert up.returncode == 1, up.stderr
        assert "it refused the credentials: check the password" in up.stderr

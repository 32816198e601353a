"""The Lua scripts as package data, their registration, and Redis error translation."""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.lanes import item, make_lanes
from workers.fleet.errors import RedisUnavailable
from workers.fleet.scripts import SCRIPT_NAMES, Scripts, client_url, redis_errors, script_source
from workers.local.redis_server import RedisServer, free_port


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """A private redis-server: SCRIPT FLUSH must not disturb other tests' shared Redis."""
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        yield client
        client.close()


def test_every_script_ships_as_package_data_with_its_layout_in_the_header() -> None:
    """Each named script is a .lua resource whose header states KEYS and ARGV."""
    shipped = {
        p.name for p in resources.files("workers.fleet.lua").iterdir() if p.name.endswith(".lua")
    }
    assert shipped == {f"{name}.lua" for name in SCRIPT_NAMES}
    for name in SCRIPT_NAMES:
        header = "\n".join(
            line for line in script_source(name).splitlines() if line.startswith("--")
        )
        assert header.startswith(f"-- {name}.lua:"), name
        assert re.search(r"^-- KEYS\s", header, re.MULTILINE), name
        assert re.search(r"^-- ARGV\s", header, re.MULTILINE), name


def test_unknown_script_name_is_refused() -> None:
    """Only the fleet's own scripts can be loaded."""
    with pytest.raises(ValueError, match="no fleet script"):
        script_source("../settings")


def test_every_script_compiles_on_a_real_redis(own_redis: redis.Redis) -> None:
    """SCRIPT LOAD accepts every file (a syntax error would fail here, not mid-turn)."""
    scripts = Scripts.register(own_redis)
    for name in SCRIPT_NAMES:
        script = getattr(scripts, name)
        assert own_redis.script_load(script_source(name)) == script.sha


def test_scripts_keep_working_after_script_flush(own_redis: redis.Redis) -> None:
    """EVALSHA reloads a flushed script, for single calls and for pipelined batches."""
    lanes = make_lanes(own_redis, "flush:")
    first = lanes.tick_many([("a", "heartbeat"), ("b", "heartbeat")])
    assert [o.outcome for o in first] == ["queued", "queued"]
    own_redis.script_flush()
    assert [o.outcome for o in lanes.tick_many([("a", "heartbeat"), ("c", "dream")])] == [
        "coalesced",
        "queued",
    ]
    own_redis.script_flush()
    assert lanes.post("d", item("x"), wake=True).outcome == "queued"
    own_redis.script_flush()
    assert lanes.renew_many([("a", 1)]) == [False]


def test_redis_errors_names_the_url_with_the_password_hidden() -> None:
    """A refused connection inside redis_errors() is RedisUnavailable with a redacted URL."""
    port = free_port()
    client = redis.Redis(
        host="127.0.0.1", port=port, password="s3cret", db=2, retry=Retry(NoBackoff(), 0)
    )
    assert client_url(client) == f"redis://:s3cret@127.0.0.1:{port}/2"
    with pytest.raises(RedisUnavailable) as caught, redis_errors(client):
        client.ping()
    assert "s3cret" not in str(caught.value)
    assert "***" in caught.value.url
    assert isinstance(caught.value.__cause__, redis.ConnectionError)

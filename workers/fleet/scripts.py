"""The fleet's Lua scripts, loaded from package data and registered on a Redis client.

Every lane and gate state transition is one ``.lua`` file in :mod:`workers.fleet.lua` (the header of
each file states its KEYS, ARGV and guarantees), so a transition is atomic on the server and
reviewable on its own. They are read with :mod:`importlib.resources` (so they ship in the
wheel) and registered with ``redis.Redis.register_script``: calls go out as ``EVALSHA`` and
reload the script by themselves after a Redis restart or ``SCRIPT FLUSH``; several calls go in
one round trip through :func:`run_scripts`, which reloads on NOSCRIPT the same way.
Registering never talks to Redis.

:func:`redis_errors` is the one place a lost Redis connection becomes
:class:`~workers.fleet.errors.RedisUnavailable` (with the password hidden).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from workers.fleet.errors import RedisUnavailable, is_redis_blip, redis_refusal

__all__ = [
    "SCRIPT_NAMES",
    "ScriptCall",
    "Scripts",
    "client_url",
    "redis_errors",
    "run_scripts",
    "script_source",
]

SCRIPT_NAMES: tuple[str, ...] = (
    "post",
    "tick",
    "start",
    "renew",
    "holds",
    "finish",
    "fail",
    "revive",
    "forget",
    "reap_running",
    "reap_queued",
    "reap_claimed",
    "unsent",
    "receive",
    "unclaim",
    "renew_claim",
    "release",
    "defer",
    "breaker_allow",
    "breaker_record",
    "breaker_release",
    "gate_acquire",
    "gate_renew",
    "gate_release",
    "usage",
    "sweep_apply",
    "hash_fields",
)


@functools.cache
def script_source(name: str) -> str:
    """The text of ``workers/fleet/lua/<name>.lua``."""
    if name not in SCRIPT_NAMES:
        raise ValueError(f"no fleet script named {name!r}; known: {', '.join(SCRIPT_NAMES)}")
    return resources.files("workers.fleet.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class Scripts:
    """Every fleet script, registered on one client."""

    post: Script
    tick: Script
    start: Script
    renew: Script
    holds: Script
    finish: Script
    fail: Script
    revive: Script
    forget: Script
    reap_running: Script
    reap_queued: Script
    reap_claimed: Script
    unsent: Script
    receive: Script
    unclaim: Script
    renew_claim: Script
    release: Script
    defer: Script
    breaker_allow: Script
    breaker_record: Script
    breaker_release: Script
    gate_acquire: Script
    gate_renew: Script
    gate_release: Script
    usage: Script
    sweep_apply: Script
    hash_fields: Script

    @classmethod
    def register(cls, client: redis.Redis) -> Scripts:
        """Register every script on ``client`` (no round trip: only the SHA is computed)."""
        return cls(**{name: client.register_script(script_source(name)) for name in SCRIPT_NAMES})


def client_url(client: redis.Redis) -> str:
    """A ``redis://`` URL describing where ``client`` connects (for error messages)."""
    kwargs = client.connection_pool.connection_kwargs
    password = kwargs.get("password")
    auth = f":{password}@" if password else ""
    path = kwargs.get("path")
    if path:
        return f"unix://{auth}{path}?db={kwargs.get('db', 0)}"
    host = kwargs.get("host", "localhost")
    return f"redis://{auth}{host}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


@contextmanager
def redis_errors(client: redis.Redis) -> Iterator[None]:
    """Turn a lost connection to ``client``'s Redis into :class:`RedisUnavailable`, and so a
    Redis that is full (:class:`RedisFull`), read-only or failing over for a while: every
    caller that waits out an unreachable Redis waits those out too (a turn running during a
    failover escaped its worker with a bare ReadOnlyError, its lane left to its lease)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(client_url(client), str(exc) or type(exc).__name__) from exc
    except redis.ResponseError as exc:
        if not is_redis_blip(exc):
            raise
        raise redis_refusal(client_url(client), exc) from exc


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One script call, prepared but not sent (for :func:`run_scripts`)."""

    script: Script
    keys: Sequence[str]
    args: Sequence[str | int | float]


def run_scripts(
    client: redis.Redis, calls: Sequence[ScriptCall], *, isolated: bool = False
) -> list[Any]:
    """Run ``calls`` in ONE round trip; their replies in order.

    Sent as plain ``EVALSHA`` commands in one pipeline: redis-py's own pipelining of scripts
    first asks ``SCRIPT EXISTS`` (a second round trip every time). A call answered NOSCRIPT
    (Redis restarted, or ``SCRIPT FLUSH``) did nothing, so its script is loaded and that call
    alone runs again. Any other error raises (after the whole batch ran), unless ``isolated``:
    then a call that failed in Redis (a key of the wrong type...) comes back as its exception
    in its place instead of failing the others (the reaper's repairs).
    """
    if not calls:
        return []
    with redis_errors(client):
        replies = _evalsha_batch(client, calls)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            for i in missing:
                client.script_load(calls[i].script.script)
            again = _evalsha_batch(client, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        if not isolated:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies


def _evalsha_batch(client: redis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for call in calls:
        pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    return list(pipe.execute(raise_on_error=False))

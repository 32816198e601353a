"""The eviction guard: refuse to run a fleet on a Redis that may silently drop its keys.

Why only ``noeviction`` passes: under memory pressure any other ``maxmemory-policy`` deletes
keys without telling anyone. ``allkeys-*`` may take acknowledged inbox items and lane hashes
(with their fences: a lane whose fence vanished can run two turns at once). ``volatile-*``
looks safer, since it only evicts keys with a TTL, but the keys soulfleet gives a TTL are
exactly the ones that must not vanish early: a turn's lease (an evicted lease is a second turn
of the same lane), a model-gate slot (the fleet-wide call limit is exceeded) and the replies a
``run`` caller is waiting for. With ``noeviction`` a full Redis refuses writes instead: loud,
alerted on (``SoulfleetRedisMemoryHigh``), and nothing acknowledged is lost.

Workers, beat and ``soulfleet up`` call :func:`check_eviction_policy` at start and refuse to run
on anything else. ``SOULFLEET_ALLOW_EVICTION=1`` overrides it for someone who knows better (a
Redis that never reaches its maxmemory); every start then logs an error-level line saying so.
The policy is read from ``INFO memory`` (``maxmemory_policy``), which managed Redis services
that rename or disable ``CONFIG`` still answer.
"""

from __future__ import annotations

import sys

import redis
import structlog

from workers.fleet.errors import EvictingRedis, RedisUnavailable, is_auth_refusal
from workers.fleet.persistence import warn_if_not_persistent
from workers.settings import Settings, redact_url

__all__ = [
    "EXIT_EVICTING",
    "SAFE_POLICY",
    "check_eviction_policy",
    "eviction_policy",
    "evicts",
    "refuse_to_start_on_eviction",
]

#: EX_CONFIG from sysexits.h: the configuration (here, Redis's) is wrong, not the program.
EXIT_EVICTING = 78

SAFE_POLICY = "noeviction"

_log = structlog.get_logger("soulfleet.redis")


def evicts(policy: str) -> bool:
    """Whether Redis under ``policy`` may delete keys (``""``: a server that reports none)."""
    return policy not in (SAFE_POLICY, "")


def eviction_policy(client: redis.Redis) -> str:
    """The server's ``maxmemory-policy`` (``""`` if the server does not report one)."""
    info = client.info("memory")
    return str(info.get("maxmemory_policy", ""))


def check_eviction_policy(client: redis.Redis, *, allow: bool, url: str, process: str) -> str:
    """Return the policy if it is safe (or allowed); raise :class:`EvictingRedis` if not.

    ``process`` ("worker", "beat", "up") goes into the log line; ``url`` is shown without its
    password. A Redis that cannot be reached raises :class:`RedisUnavailable`.
    """
    try:
        policy = eviction_policy(client)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(redact_url(url), str(exc)) from exc
    if not evicts(policy):
        return policy
    if allow:
        _log.error(
            "redis.eviction_allowed",
            process=process,
            policy=policy,
            url=redact_url(url),
            error=f"Redis maxmemory-policy is {policy}: keys may be evicted (leases, inbox "
            "items, fences) and turns lost or doubled; running anyway because "
            "SOULFLEET_ALLOW_EVICTION is set",
        )
        return policy
    raise EvictingRedis(redact_url(url), policy)


def refuse_to_start_on_eviction(settings: Settings, process: str) -> None:
    """The start-up gate of workers and beat: exit (status 78, EX_CONFIG) with a message naming
    ``maxmemory-policy`` when Redis may evict, or naming the database when Redis has none of
    that number; warn when it keeps nothing on disk
    (:mod:`workers.fleet.persistence`). An unreachable Redis is only logged
    (``redis.policy_unchecked``): the process then waits for it like for any outage."""
    client = redis.Redis.from_url(
        settings.redis_url, decode_responses=True, socket_connect_timeout=5, socket_timeout=10
    )
    try:
        check_eviction_policy(
            client, allow=settings.allow_eviction, url=settings.redis_url, process=process
        )
        warn_if_not_persistent(client, url=settings.redis_url, process=process)
    except EvictingRedis as exc:
        _log.error("redis.evicting_policy", process=process, policy=exc.policy, error=str(exc))
        print(f"soulfleet {process}: refusing to start: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_EVICTING) from None
    except (RedisUnavailable, redis.ConnectionError, redis.TimeoutError) as exc:
        if is_auth_refusal(str(exc)):
            # Waiting cannot help a refused password: Celery retried it forever, logging
            # "Authentication required." a line at a time. Refused, as a bad database is.
            detail = exc.detail if isinstance(exc, RedisUnavailable) else str(exc)
            message = (
                f"Redis at {redact_url(settings.redis_url)} refused this process's credentials "
                f"({detail}): check the password (and user) in REDIS_URL (CELERY_BROKER_URL "
                "too, when the broker is a Redis of its own)"
            )
            _log.error("redis.auth_refused", process=process, error=message)
            print(f"soulfleet {process}: refusing to start: {message}", file=sys.stderr,
                  flush=True)  # fmt: skip
            raise SystemExit(EXIT_EVICTING) from None
        _log.warning("redis.policy_unchecked", process=process, error=str(exc))
    except redis.ResponseError as exc:
        if "DB index is out of range" not in str(exc):
            _log.warning("redis.policy_unchecked", process=process, error=str(exc))
            return
        # Celery swallows a worker_init handler's exception and starts anyway, retrying the
        # database forever; beat died with a traceback. Neither can ever work: refuse.
        message = (
            f"Redis refused the database that REDIS_URL selects ({redact_url(settings.redis_url)}"
            "): it has fewer databases (its `databases` setting, 16 by default: 0-15); use one"
        )
        _log.error("redis.bad_database", process=process, error=message)
        print(f"soulfleet {process}: refusing to start: {message}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_EVICTING) from None
    finally:
        client.close()

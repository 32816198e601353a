"""The persistence check: say loudly at start when the fleet's Redis keeps nothing on disk.

Why a warning and not a refusal (as for an evicting ``maxmemory-policy``): a Redis without
persistence loses nothing while it runs, and a replicated or managed Redis may be durable in
ways one server cannot report. But a restart of a Redis with neither AOF nor RDB save points
loses every inbox item (posts already answered "queued"), lane, schedule and usage counter, and
the first sign is beat's ``redis.data_lost`` after the loss (when beat ran across it). So
workers, beat and ``up`` log ``redis.not_persistent`` at start, naming what to change.
"""

from __future__ import annotations

import redis
import structlog

from workers.settings import redact_url

__all__ = ["persistence", "warn_if_not_persistent"]

_log = structlog.get_logger("soulfleet.redis")


def persistence(client: redis.Redis) -> str | None:
    """How the server persists ("aof", "rdb"), "none", or None when it cannot tell
    (``CONFIG`` renamed or refused, as managed services do)."""
    info = client.info("persistence")
    if int(info.get("aof_enabled", 0) or 0):
        return "aof"
    try:
        reply = client.config_get("save")
    except redis.ResponseError:
        return None
    save = reply.get("save", "") if isinstance(reply, dict) else ""
    return "rdb" if str(save).strip() else "none"


def warn_if_not_persistent(client: redis.Redis, *, url: str, process: str) -> str | None:
    """Log ``redis.not_persistent`` when the server keeps nothing on disk; return what
    :func:`persistence` found. Connection errors propagate."""
    found = persistence(client)
    if found == "none":
        _log.warning(
            "redis.not_persistent",
            process=process,
            url=redact_url(url),
            error="Redis keeps nothing on disk (appendonly no, no save points): a restart of "
            "Redis loses every inbox item, lane, schedule and usage count. Turn on AOF "
            "(appendonly yes, appendfsync everysec) unless you accept that",
        )
    return found

"""The one settings object: read from the environment once, frozen, passed down.

Every variable soulfleet reads is parsed here (the model provider variables are parsed by
:class:`workers.persona.models.config.ModelConfig`, which this object embeds), so the README's
configuration table has exactly one place to be checked against. A bad value fails loudly at
start-up with :class:`SettingsError` naming the variable; nothing falls back silently. The typed
reads themselves are the core's :class:`~workers.persona.env.EnvReader`, shared with
``ModelConfig`` so both give the same messages.

This module imports nothing heavy: the persona core, the CLI and Celery's app module all read it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import redis
from kombu.transport import TRANSPORT_ALIASES
from kombu.utils.url import url_to_parts
from redis.connection import ConnectionPool, parse_url

from workers.broker_urls import kombu_url, redis_py_url
from workers.persona.env import EnvReader
from workers.persona.errors import SettingsError
from workers.persona.mcp_servers import FleetServer, load_mcp_servers
from workers.persona.models.config import ModelConfig
from workers.persona.urls import ambiguous_credentials, mask_credentials, split_credentials
from workers.pools import POOLS, missing_package, pool_limit, refusal

__all__ = ["LockMode", "LogFormat", "Settings", "SettingsError", "redact_url"]

LockMode = Literal["local", "shared"]
LogFormat = Literal["console", "json"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: Turns one worker runs at once. A turn mostly waits on a model (2-30 s), so the unit of
#: capacity is a waiting thread, not a core: 200 threads keep 100 turns/s going at 2 s a call.
DEFAULT_CONCURRENCY = 200
#: The fleet-wide turn gate's default: five default workers' worth, so it never binds a single
#: host below its concurrency; set it to what your provider account allows.
DEFAULT_MODEL_CALLS = 1000
# The spec shape only: which providers exist is workers.persona.models.spec's call, and that
# module imports the HTTP clients, which settings must not.
_MODEL_SPEC = re.compile(r"(?:openai|anthropic|scripted):\S.*", re.DOTALL)
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})")


def redact_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***`` (safe for logs and errors).

    The credentials are masked as a unit whatever characters they hold
    (:mod:`workers.persona.urls`), never by what a standard URL parser calls the password.
    """
    return mask_credentials(url)


@dataclass(frozen=True, slots=True, repr=False)
class Settings:
    """Everything a soulfleet process is configured with. Build it with :meth:`from_env`."""

    redis_url: str = DEFAULT_REDIS_URL
    #: True when REDIS_URL was set explicitly (the CLI then never looks for an embedded Redis).
    redis_url_explicit: bool = False
    broker_url: str = DEFAULT_REDIS_URL
    personas: Path = Path("personas")
    key_prefix: str = "soulfleet:"
    queue_prefix: str = "soulfleet"
    model: ModelConfig = field(default_factory=ModelConfig)
    #: per-kind fleet defaults ("" = the persona's own model); see workers.persona.spend.
    heartbeat_model: str = ""
    dream_model: str = ""

    # Spend.
    #: fleet-wide daily token budget per persona (None: no budget unless persona.toml sets one)
    daily_tokens: int | None = None
    #: days of per-persona token usage kept in Redis
    usage_days: int = 8

    # Lanes and turns.
    inbox_max: int = 1000
    item_max_bytes: int = 64 * 1024
    lease_ttl: float = 30.0
    max_attempts: int = 5
    turn_max_seconds: float = 600.0
    turn_max_model_calls: int = 24
    turn_max_tool_calls: int = 64
    turn_max_tokens: int = 400_000
    visibility_timeout: float = 7200.0
    max_concurrent_model_calls: int = DEFAULT_MODEL_CALLS
    gate_slot_ttl: float = 30.0
    beats_max: int = 10_000
    transcript_max_conversations: int = 1000
    reply_ttl: float = 3600.0
    reply_max_bytes: int = 256 * 1024
    beat_max_bytes: int = 4096

    # Redis guardrails.
    allow_eviction: bool = False

    # Persona tools (MCP servers and Python tools declared in persona.toml).
    mcp_config: Path | None = None
    #: The servers of the SOULFLEET_MCP_CONFIG file, read once at start-up.
    mcp_servers: Mapping[str, FleetServer] = field(default_factory=dict)
    tool_args_max_bytes: int = 64 * 1024
    tool_result_max_bytes: int = 128 * 1024
    # Failed turns (workers/fleet/retries.py) and the provider breaker (workers/fleet/breaker.py).
    retry_base: float = 2.0
    retry_max: float = 300.0
    retry_for: float = 6 * 3600.0
    claim_ttl: float = 6.0
    breaker_window: float = 30.0
    breaker_min_calls: int = 10
    breaker_failure_ratio: float = 0.5
    breaker_probe_interval: float = 10.0

    # Memory files.
    lock_mode: LockMode = "local"
    lock_timeout: float = 10.0

    # Worker pool.
    worker_pool: str = "threads"
    worker_concurrency: int = DEFAULT_CONCURRENCY
    #: A thread pool's turns take turns at their Python work (workers/turn/baton.py).
    turn_baton: bool = True

    # beat.
    sweep_interval: float = 1.0
    sync_interval: float = 10.0
    reap_interval: float = 15.0
    reap_queued_after: float = 600.0
    recover_interval: float = 1.0
    sweep_batch: int = 5000
    heartbeat_jitter: float = 0.1
    dream_window: float = 3600.0

    # Observability.
    #: Celery task events (what Flower shows); off by default: they cost a Redis PUBLISH per
    #: sent, received, started and succeeded task.
    task_events: bool = False
    log_format: LogFormat = "console"
    log_level: str = "INFO"
    metrics_port: int = 0
    #: Address /metrics binds: loopback unless said otherwise (a container says 0.0.0.0).
    metrics_host: str = "127.0.0.1"
    hostname: str = field(default_factory=socket.gethostname)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, model_reach: bool = True
    ) -> Settings:
        """Parse ``environ`` (default ``os.environ``); a bad value raises :class:`SettingsError`.

        ``model_reach=False``: see :meth:`ModelConfig.from_env` (``reach``)."""
        env = EnvReader(os.environ if environ is None else environ)
        redis_raw = env.raw("REDIS_URL")
        redis_url = redis_raw or DEFAULT_REDIS_URL
        _check_redis_url("REDIS_URL", redis_url)
        broker_url = kombu_url(env.text("CELERY_BROKER_URL", redis_url))
        _check_broker_url("CELERY_BROKER_URL", broker_url)
        prefix = env.text("SOULFLEET_KEY_PREFIX", "soulfleet:")
        if any(ch.isspace() for ch in prefix):
            raise SettingsError("SOULFLEET_KEY_PREFIX", "must not contain white space")

        turn_max_seconds = env.duration("SOULFLEET_TURN_MAX_SECONDS", 600.0, minimum=1.0)
        model = ModelConfig.from_env(os.environ if environ is None else environ, reach=model_reach)
        # A model call may take its timeout on every try; the turn's wall budget is only
        # checked between steps, so the broker must not redeliver before both have run out.
        worst_turn = turn_max_seconds + model.timeout * (model.retries + 1)
        visibility_timeout = env.duration(
            "SOULFLEET_VISIBILITY_TIMEOUT", max(7200.0, 4 * worst_turn), minimum=1.0
        )
        if visibility_timeout < 2 * worst_turn:
            raise SettingsError(
                "SOULFLEET_VISIBILITY_TIMEOUT",
                f"must be at least {2 * worst_turn:.0f}s, twice the longest a turn can run "
                f"({worst_turn:.0f}s: SOULFLEET_TURN_MAX_SECONDS plus the model timeout on "
                "every try), or the broker redelivers turns that are still running; got "
                f"{visibility_timeout:.0f}",
            )
        lease_ttl = env.duration("SOULFLEET_LEASE_TTL", 30.0, minimum=1.0)
        mcp_raw = env.raw("SOULFLEET_MCP_CONFIG")
        mcp_config = None if mcp_raw is None else Path(mcp_raw).expanduser()
        retry_base = env.duration("SOULFLEET_RETRY_BASE", 2.0, minimum=0.001)
        retry_max = env.duration("SOULFLEET_RETRY_MAX", 300.0, minimum=0.001)
        if retry_max < retry_base:
            # The cap would silently win over the base: every retry waits at most the cap.
            unset = env.raw("SOULFLEET_RETRY_MAX") is None
            got = f"{retry_max:g}s (its default: it is not set)" if unset else f"{retry_max:g}s"
            raise SettingsError(
                "SOULFLEET_RETRY_MAX",
                f"must be at least SOULFLEET_RETRY_BASE ({retry_base:g}s), got {got}; raise "
                "SOULFLEET_RETRY_MAX or lower SOULFLEET_RETRY_BASE",
            )
        metrics_port = env.integer("SOULFLEET_METRICS_PORT", 0)
        if metrics_port > 65535:
            raise SettingsError("SOULFLEET_METRICS_PORT", f"must be a TCP port, got {metrics_port}")

        pool = env.choice("SOULFLEET_WORKER_POOL", "threads", POOLS)
        absent = missing_package(pool)
        if absent is not None:
            raise SettingsError("SOULFLEET_WORKER_POOL", absent)
        concurrency = env.integer(
            "SOULFLEET_WORKER_CONCURRENCY",
            min(DEFAULT_CONCURRENCY, pool_limit(pool)),
            minimum=1,
        )
        refused = refusal(pool, concurrency)
        if refused is not None:
            raise SettingsError("SOULFLEET_WORKER_CONCURRENCY", refused)

        daily_tokens = (
            None
            if env.raw("SOULFLEET_DAILY_TOKENS") is None
            else env.integer("SOULFLEET_DAILY_TOKENS", 0, minimum=0)
        )
        return cls(
            redis_url=redis_url,
            redis_url_explicit=redis_raw is not None,
            broker_url=broker_url,
            personas=Path(env.text("SOULFLEET_PERSONAS", "personas")).expanduser(),
            key_prefix=prefix,
            queue_prefix=env.text("SOULFLEET_QUEUE_PREFIX", "soulfleet"),
            model=model,
            heartbeat_model=_model_spec(env, "SOULFLEET_HEARTBEAT_MODEL"),
            dream_model=_model_spec(env, "SOULFLEET_DREAM_MODEL"),
            daily_tokens=daily_tokens,
            usage_days=env.integer("SOULFLEET_USAGE_DAYS", 8, minimum=1),
            inbox_max=env.integer("SOULFLEET_INBOX_MAX", 1000, minimum=1),
            item_max_bytes=env.integer("SOULFLEET_ITEM_MAX_BYTES", 64 * 1024, minimum=1),
            lease_ttl=lease_ttl,
            max_attempts=env.integer("SOULFLEET_MAX_ATTEMPTS", 5, minimum=1),
            turn_max_seconds=turn_max_seconds,
            turn_max_model_calls=env.integer("SOULFLEET_TURN_MAX_MODEL_CALLS", 24, minimum=1),
            turn_max_tool_calls=env.integer("SOULFLEET_TURN_MAX_TOOL_CALLS", 64, minimum=0),
            turn_max_tokens=env.integer("SOULFLEET_TURN_MAX_TOKENS", 400_000, minimum=1),
            visibility_timeout=visibility_timeout,
            max_concurrent_model_calls=env.integer(
                "SOULFLEET_MAX_CONCURRENT_MODEL_CALLS", DEFAULT_MODEL_CALLS, minimum=0
            ),
            gate_slot_ttl=env.duration("SOULFLEET_GATE_SLOT_TTL", 30.0, minimum=1.0),
            beats_max=env.integer("SOULFLEET_BEATS_MAX", 10_000, minimum=1),
            transcript_max_conversations=env.integer(
                "SOULFLEET_TRANSCRIPT_MAX_CONVERSATIONS", 1000, minimum=1
            ),
            reply_ttl=env.duration("SOULFLEET_REPLY_TTL", 3600.0, minimum=1.0),
            mcp_config=mcp_config,
            mcp_servers={} if mcp_config is None else load_mcp_servers(mcp_config),
            tool_args_max_bytes=env.integer("SOULFLEET_TOOL_ARGS_MAX_BYTES", 64 * 1024, minimum=1),
            tool_result_max_bytes=env.integer(
                "SOULFLEET_TOOL_RESULT_MAX_BYTES", 128 * 1024, minimum=1
            ),
            retry_base=retry_base,
            retry_max=retry_max,
            retry_for=env.duration("SOULFLEET_RETRY_FOR", 6 * 3600.0, minimum=1.0),
            claim_ttl=env.duration("SOULFLEET_CLAIM_TTL", 6.0, minimum=1.0),
            breaker_window=env.duration("SOULFLEET_BREAKER_WINDOW", 30.0, minimum=1.0),
            breaker_min_calls=env.integer("SOULFLEET_BREAKER_MIN_CALLS", 10, minimum=1),
            breaker_failure_ratio=_ratio(env, "SOULFLEET_BREAKER_FAILURE_RATIO", 0.5),
            breaker_probe_interval=env.duration(
                "SOULFLEET_BREAKER_PROBE_INTERVAL", 10.0, minimum=0.1
            ),
            reply_max_bytes=env.integer("SOULFLEET_REPLY_MAX_BYTES", 256 * 1024, minimum=1024),
            beat_max_bytes=env.integer("SOULFLEET_BEAT_MAX_BYTES", 4096, minimum=256),
            allow_eviction=env.flag("SOULFLEET_ALLOW_EVICTION", False),
            lock_mode="shared"
            if env.choice("SOULFLEET_LOCK_MODE", "local", ("local", "shared")) == "shared"
            else "local",
            lock_timeout=env.duration("SOULFLEET_LOCK_TIMEOUT", 10.0, minimum=0.0),
            worker_pool=pool,
            worker_concurrency=concurrency,
            sweep_interval=env.duration("SOULFLEET_SWEEP_INTERVAL", 1.0, minimum=0.05),
            sync_interval=env.duration("SOULFLEET_SYNC_INTERVAL", 10.0, minimum=0.1),
            reap_interval=env.duration("SOULFLEET_REAP_INTERVAL", 15.0, minimum=0.1),
            reap_queued_after=env.duration("SOULFLEET_REAP_QUEUED_AFTER", 600.0, minimum=1.0),
            recover_interval=env.duration("SOULFLEET_RECOVER_INTERVAL", 1.0, minimum=0.05),
            sweep_batch=env.integer("SOULFLEET_SWEEP_BATCH", 5000, minimum=1),
            heartbeat_jitter=_fraction(env, "SOULFLEET_HEARTBEAT_JITTER", 0.1),
            dream_window=env.duration("SOULFLEET_DREAM_WINDOW", 3600.0),
            task_events=env.flag("SOULFLEET_TASK_EVENTS", False),
            turn_baton=env.flag("SOULFLEET_TURN_BATON", True),
            log_format="json"
            if env.choice("SOULFLEET_LOG_FORMAT", "console", ("console", "json")) == "json"
            else "console",
            log_level=env.choice(
                "SOULFLEET_LOG_LEVEL", "info", ("debug", "info", "warning", "error")
            ).upper(),
            metrics_port=metrics_port,
            metrics_host=_host(env, "SOULFLEET_METRICS_HOST", "127.0.0.1"),
            hostname=env.text("SOULFLEET_HOSTNAME", socket.gethostname()),
        )

    def __repr__(self) -> str:
        # A settings object may end up in a log line or a traceback: never with a password.
        parts = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            shown = redact_url(value) if name.endswith("_url") else value
            parts.append(f"{name}={shown!r}")
        return f"Settings({', '.join(parts)})"

    @property
    def lease_renew_every(self) -> float:
        """Renew three times per TTL so one slow round trip never loses a live lease."""
        return self.lease_ttl / 3


def _model_spec(env: EnvReader, name: str) -> str:
    """A per-kind model default: empty or "inherit" (the persona's model) or a spec."""
    value = env.text(name, "").strip()
    if value.lower() in ("", "inherit"):
        return ""
    if _MODEL_SPEC.fullmatch(value) is None:
        raise SettingsError(
            name,
            "must be empty, 'inherit' or a model spec such as 'openai:<model>', "
            f"'anthropic:<model>' or 'scripted:<path>', got {value!r}",
        )
    return value


def _fraction(env: EnvReader, name: str, default: float) -> float:
    value = env.number(name, default)
    if value > 0.5:
        raise SettingsError(name, f"must be between 0 and 0.5, got {value}")
    return value


def _ratio(env: EnvReader, name: str, default: float) -> float:
    value = env.number(name, default)
    if not 0 < value <= 1:
        raise SettingsError(name, f"must be a fraction in (0, 1], got {value}")
    return value


def _host(env: EnvReader, name: str, default: str) -> str:
    value = env.text(name, default)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not _HOSTNAME.fullmatch(value):
            raise SettingsError(
                name, f"must be an IP address or host name, got {value!r}"
            ) from None
    return value


def _check_redis_url(name: str, url: str) -> None:
    scheme = split_credentials(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise SettingsError(
            name, f"must be a redis://, rediss:// or unix:// URL, got {redact_url(url)!r}"
        )
    if ambiguous_credentials(url):
        raise SettingsError(
            name,
            f"has a password with a raw '/', '?' or '#' ({redact_url(url)}), which every URL "
            "parser reads as the end of the host: percent-encode the password (/ -> %2F, "
            "? -> %3F, # -> %23, @ -> %40, : -> %3A, % -> %25)",
        )
    _check_parts(name, redis_py_url(url), client=True)


def _check_options(name: str, url: str) -> None:
    """A query option redis-py's parser lets through reaches the connection's constructor only
    when a command first connects, as a TypeError: the connection is built here (no socket
    opened) so the variable is named instead."""
    try:
        # A plain pool, as the CLI's short reads and kombu take the URL too: an option only
        # the fleet's blocking pool knows (`timeout`) crashed them.
        ConnectionPool.from_url(url).make_connection()
    except (TypeError, redis.ConnectionError) as exc:  # ConnectionError: `protocol=9`
        raise SettingsError(
            name,
            f"has an option the Redis client does not take ({redact_url(url)}): {exc} "
            "(redis-py's URL options: socket_timeout, health_check_interval, ...)",
        ) from None


def _check_broker_url(name: str, url: str) -> None:
    """A broker URL whose parts the broker's client would refuse only later, mid-command (a
    Redis one after a message was already queued): refused here, naming the variable. Celery
    takes several, separated by ``;`` (failover brokers, Sentinels): each is checked."""
    for one in (part.strip() for part in url.split(";") if part.strip()):
        if ambiguous_credentials(one):
            raise SettingsError(
                name,
                f"has a password with a raw '/', '?' or '#' ({redact_url(one)}): "
                "percent-encode it (/ -> %2F, ? -> %3F, # -> %23)",
            )
        scheme = split_credentials(one).scheme.lower()
        if scheme in ("redis", "rediss", "redis+socket"):
            _check_parts(name, redis_py_url(one))
            continue
        # kombu takes `bogus` for a host of its default transport (amqp): a worker then
        # retried connecting to amqp://guest@bogus forever, naming no variable.
        if "://" not in one or scheme.split("+")[0] not in TRANSPORT_ALIASES:
            raise SettingsError(
                name,
                f"is not a broker URL ({redact_url(one)}): its scheme must name a transport "
                "kombu has, e.g. redis://host:6379/0 or amqp://user:password@host:5672//",
            )
        try:
            url_to_parts(one)  # Sentinel, RabbitMQ and the rest: kombu's parser, as it is used
        except ValueError as exc:
            raise SettingsError(name, f"is not a valid URL ({redact_url(one)}): {exc}") from None


def _check_parts(name: str, url: str, *, client: bool = False) -> None:
    """The port, host, database and options of a redis-py URL, as its client parses them
    (``client``: the URL of a redis-py client, whose every option must be one it takes; a
    broker URL's may be kombu's)."""
    parts = split_credentials(url)
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise SettingsError(name, f"is not a valid Redis URL ({redact_url(url)}): {exc}") from None
    if client:
        _check_options(name, url)
    if parts.scheme == "unix":
        return
    database = parts.rest.partition("?")[0].partition("/")[2].strip("/")
    if database and not database.isdigit():
        # redis-py ignores it and kombu refuses it: which database would be used depends on
        # the process, so it is an error for both
        raise SettingsError(
            name,
            f"names database {database!r} ({redact_url(url)}): the path after the host is the "
            "database number, such as redis://host:6379/0",
        )

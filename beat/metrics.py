"""Prometheus metrics only beat measures: its sweeps and ticks, registry syncs, breakers.

Defined apart from :mod:`workers.metrics` (which every process imports) so that only beat's
scrape shows them: a worker exported each at 0, and a query without a ``job`` filter (the
shipped rules and dashboards have one) read a stale sweep or a closed breaker from every
worker. Labels follow the same rule: kinds, reasons, providers; never a persona.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from workers.metrics import LATENCY_BUCKETS

__all__ = [
    "BREAKER_OPEN",
    "LAST_SWEEP",
    "REDIS_DATA_LOST",
    "REGISTRY_INVALID",
    "ROOT_CONFLICTS",
    "SWEEP_DUE",
    "SWEEP_SECONDS",
    "TICKS",
    "TICKS_SKIPPED",
]

TICKS = Counter(
    "soulfleet_ticks_total",
    "Ticks beat's sweep handled, by outcome (emitted = a turn was queued); ticks a command sends "
    "(`soulfleet dream`) are not counted here.",
    ["kind", "outcome"],
)

TICKS_SKIPPED = Counter(
    "soulfleet_ticks_skipped_total",
    "Ticks the sweep skipped without a model call, by reason.",
    ["kind", "reason"],
)

SWEEP_SECONDS = Histogram(
    "soulfleet_sweep_seconds", "Wall time of one schedule sweep.", buckets=LATENCY_BUCKETS
)

SWEEP_DUE = Gauge("soulfleet_sweep_due", "Schedule entries due in the newest sweep.")

LAST_SWEEP = Gauge("soulfleet_last_sweep_timestamp_seconds", "Unix time the newest sweep finished.")

BREAKER_OPEN = Gauge(
    "soulfleet_provider_breaker_open",
    "1 while a model provider's breaker is open (calls paused, lanes deferred), else 0; set by "
    "beat's recovery pass.",
    ["provider"],
)

REDIS_DATA_LOST = Counter(
    "soulfleet_redis_data_lost_total",
    "Registry syncs that found the marker beat set in Redis gone: Redis lost its data (a "
    "restart without AOF, FLUSHALL) while beat ran.",
)

REGISTRY_INVALID = Gauge(
    "soulfleet_registry_invalid_personas",
    "Personas beat's registry sync refused (bad persona.toml, non-regular or unreadable files).",
)

ROOT_CONFLICTS = Counter(
    "soulfleet_beat_root_conflicts_total",
    "Registry syncs that found the personas root this beat records replaced by another's: two "
    "beats serving different roots, each removing the other's schedule at every sync.",
)

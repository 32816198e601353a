"""Prometheus metrics of every soulfleet process (beat's own are in :mod:`beat.metrics`).

Labels are low-cardinality by rule: kinds, statuses, reasons, states. Never a persona or lane
name (a fleet of 100,000 personas would be 100,000 series per metric). Per-persona detail is
what ``soulfleet status`` and the logs are for.

Workers and beat each serve ``/metrics`` on ``SOULFLEET_METRICS_PORT`` (0 = off). Lane-state
gauges are read from Redis at scrape time by :class:`LaneStateCollector`, which only beat
registers, so a fleet with many workers does not report the same lanes many times. What only
beat measures (its sweeps, ticks, registry syncs, breakers) is in :mod:`beat.metrics`, which
no worker imports: a worker's scrape would otherwise show those gauges at 0.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

import structlog
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from workers.metric_files import ENV, shared

__all__ = [
    "BATON_WAIT",
    "BATON_WAITED_OUT",
    "BEATS",
    "CACHED_INPUT_TOKENS",
    "CACHE_WRITE_INPUT_TOKENS",
    "COUNT_KEYS",
    "DEAD_LETTERED",
    "LANES",
    "LANES_STUCK",
    "LATENCY_BUCKETS",
    "LEASE_LOSSES",
    "MEMORY_LOCK_WAIT",
    "MEMORY_WRITE_FAILURES",
    "MODEL_CALLS",
    "MODEL_CALL_OLDEST",
    "MODEL_CALL_SECONDS",
    "MODEL_TOKENS",
    "REAPER_REPAIRS",
    "REDIS_CONNECTION_WAIT",
    "REDIS_EVICTING",
    "REDIS_MEMORY_MAX",
    "REDIS_MEMORY_USED",
    "TOOL_CALLS",
    "TOOL_CALL_SECONDS",
    "TURNS",
    "TURNS_NO_CALL",
    "TURNS_SKIPPED",
    "TURN_GATE_WAIT",
    "TURN_SECONDS",
    "LaneStateCollector",
    "observe_tool_call",
    "serve_metrics",
]

_log = structlog.get_logger("soulfleet.metrics")

# Where this process's values live, chosen before the first metric below is built (the rule
# prometheus_client keeps; it chose once already when imported, maybe before share() ran:
# Celery's command line loads Flower's, which imports it).
if shared():  # a prefork worker and its children: files its endpoint sums (metric_files)
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
else:
    # A PROMETHEUS_MULTIPROC_DIR in the environment is another program's: every soulfleet
    # process but a prefork worker keeps its values in memory, so it neither fails on a
    # directory that is gone nor leaves files in one (or counts into another's sum).
    os.environ.pop(ENV, None)
    values.ValueClass = values.MutexValue

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

TURNS = Counter(
    "soulfleet_turns_total",
    "Turns that ended, by kind (interactive|heartbeat|dream) and status.",
    ["kind", "status"],
)
TURNS_NO_CALL = Counter(
    "soulfleet_turns_input_over_budget_total",
    "Turns that ended incomplete before any model call because their input alone (soul and "
    "session) was over the turn's token budget; every turn of that persona does the same until "
    "its soul or session shrinks.",
    ["kind"],
)
for _kind in ("interactive", "heartbeat", "dream"):  # from 0, so the first one is an increase
    TURNS_NO_CALL.labels(kind=_kind)
BEATS = Counter(
    "soulfleet_beats_total",
    "Heartbeat turn replies: surfaced (substantive) or silent (HEARTBEAT_OK).",
    ["outcome"],
)
CACHED_INPUT_TOKENS = Counter(
    "soulfleet_cached_input_tokens_total",
    "Prompt tokens providers served from their prompt cache (OpenAI cached_tokens, Anthropic "
    "cache_read_input_tokens), summed over committed turns.",
)
CACHE_WRITE_INPUT_TOKENS = Counter(
    "soulfleet_cache_write_input_tokens_total",
    "Prompt tokens written to a provider's prompt cache (Anthropic "
    "cache_creation_input_tokens), summed over committed turns.",
)
TURN_SECONDS = Histogram(
    "soulfleet_turn_seconds", "Wall time of a turn.", ["kind"], buckets=LATENCY_BUCKETS
)
MODEL_CALL_SECONDS = Histogram(
    "soulfleet_model_call_seconds",
    "Wall time of one model call (inside the turn gate).",
    ["provider"],
    buckets=LATENCY_BUCKETS,
)
MODEL_TOKENS = Counter(
    "soulfleet_model_tokens_total",
    "Tokens model providers reported, by provider, model, turn kind and type "
    "(input = every prompt token, cached_input = the part read from a prompt cache, output).",
    ["provider", "model", "kind", "type"],
)
MODEL_CALLS = Counter(
    "soulfleet_model_calls_total",
    "Model calls that returned an answer (paid calls), by provider, model and turn kind.",
    ["provider", "model", "kind"],
)
TURNS_SKIPPED = Counter(
    "soulfleet_turns_skipped_total",
    "Turns a worker ended without a model call, by kind and reason (budget, nothing_new, "
    "quiet_hours, nothing_to_answer).",
    ["kind", "reason"],
)
TURN_GATE_WAIT = Histogram(
    "soulfleet_turn_gate_wait_seconds",
    "Time a model call waited for a fleet-wide turn gate slot.",
    buckets=LATENCY_BUCKETS,
)
TOOL_CALLS = Counter(
    "soulfleet_tool_calls_total",
    "Tool calls by source (builtin|mcp|python|unknown) and outcome (ok|tool_error|timeout|"
    "too_large|server_died|unavailable|protocol_error|raised|unknown_tool|bad_arguments|error).",
    ["source", "outcome"],
)
TOOL_CALL_SECONDS = Histogram(
    "soulfleet_tool_call_seconds",
    "Wall time of one tool call, by source.",
    ["source"],
    buckets=LATENCY_BUCKETS,
)


def observe_tool_call(source: str, outcome: str, seconds: float) -> None:
    """The persona core's tool-call observer (see workers.persona.loop.set_tool_call_observer)."""
    TOOL_CALLS.labels(source=source, outcome=outcome).inc()
    TOOL_CALL_SECONDS.labels(source=source).observe(seconds)


def observe_memory_failure(reason: str) -> None:
    """The memory tool's failure observer (:func:`set_write_failure_observer`)."""
    MEMORY_WRITE_FAILURES.labels(reason=reason).inc()


LEASE_LOSSES = Counter(
    "soulfleet_lease_losses_total", "Turns stopped because their lane lease was lost."
)
MEMORY_WRITE_FAILURES = Counter(
    "soulfleet_memory_write_failures_total",
    "Memory tool writes that failed, by reason: full (the file is at its size cap), os_error "
    "(read-only, no space, not permitted), lock_timeout, persona_file.",
    ["reason"],
)
MEMORY_LOCK_WAIT = Histogram(
    "soulfleet_memory_lock_wait_seconds",
    "Time a memory write waited for its file lock.",
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30),
)
BATON_WAITED_OUT = Counter(
    "soulfleet_baton_waited_out_total",
    "Times a turn waited its patience (2 s) for the worker's baton and ran without it "
    "(workers/turn/baton.py): a turn held it through a wait nobody marked, or the process is "
    "short of CPU. Turns are not harmed; a steady rate means the baton is not doing its job.",
)
BATON_WAIT = Histogram(
    "soulfleet_baton_wait_seconds",
    "Time a turn waited for its worker's baton in all (workers/turn/baton.py): its share of "
    "queueing for the worker's CPU. A median near zero: CPU to spare; rising toward the turn's "
    "own work: the worker is CPU-bound (run more worker processes).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
REDIS_CONNECTION_WAIT = Histogram(
    "soulfleet_redis_connection_wait_seconds",
    "Time a thread waited for a free connection of its process's Redis client (coordination: "
    "lanes, the turn gate, the usage ledger; publisher: raw turn publishing). Only waits are "
    "counted: a call that found a connection free costs nothing here.",
    ["client"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30),
)
REAPER_REPAIRS = Counter(
    "soulfleet_reaper_repairs_total",
    "Lanes beat's recovery re-queued, by reason: the reaper's repairs (a lost message, a dead "
    "worker) and routine recovery (retry_due: a backoff ended; resumed: a breaker closed).",
    ["reason"],
)

# Every label value an alert watches is exported from 0 when the process starts: Prometheus's
# increase() does not count a series' first appearance, so the first failure of each kind in
# each process (the first error turn, the first memory write refused, the first lane the
# reaper takes back) was invisible to the alerts.
for _kind in ("interactive", "heartbeat", "dream"):
    for _status in ("done", "incomplete", "error"):
        TURNS.labels(kind=_kind, status=_status)
for _reason in ("full", "os_error", "lock_timeout", "persona_file"):
    MEMORY_WRITE_FAILURES.labels(reason=_reason)
for _reason in ("lease_expired", "queued_too_long", "unsent", "claim_lapsed", "retry_due",
                "resumed"):  # fmt: skip
    REAPER_REPAIRS.labels(reason=_reason)
for _client in ("coordination", "publisher"):
    REDIS_CONNECTION_WAIT.labels(client=_client)

LANES = "soulfleet_lanes"
LANES_STUCK = "soulfleet_lanes_stuck"
DEAD_LETTERED = "soulfleet_dead_lettered_lanes"
REDIS_MEMORY_USED = "soulfleet_redis_memory_used_bytes"
REDIS_MEMORY_MAX = "soulfleet_redis_maxmemory_bytes"
REDIS_EVICTING = "soulfleet_redis_evicting_policy"
MODEL_CALL_OLDEST = "soulfleet_model_call_oldest_seconds"

#: Keys :class:`LaneStateCollector` reads from its ``counts`` callable.
COUNT_KEYS = (
    "idle",
    "queued",
    "running",
    "dead",
    "retry",
    "deferred",
    "stuck_running",
    "stuck_queued",
    "redis_memory_used",
    "redis_maxmemory",
    "redis_evicting",
    "model_call_oldest",
)


class LaneStateCollector(Collector):
    """Reads fleet-wide gauges from Redis at scrape time (beat registers it).

    ``counts`` returns a dict with :data:`COUNT_KEYS`: lanes by state, lanes stuck (running
    with an expired lease, or queued longer than the reaper threshold), and Redis memory (used
    and ``maxmemory``; 0 = no limit) so alerts need no separate exporter.
    """

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        try:
            counts = self._counts()
        except Exception as exc:  # a scrape must never crash the process it runs in
            _log.warning("metrics.lane_counts_failed", error=str(exc))
            return
        lanes = GaugeMetricFamily(
            LANES,
            "Lanes by state (idle = registered lanes not queued, running, dead, waiting out a "
            "retry backoff or deferred by an open provider breaker).",
            labels=["state"],
        )
        for state in ("idle", "queued", "running", "dead", "retry", "deferred"):
            lanes.add_metric([state], float(counts.get(state, 0)))
        yield lanes
        stuck = GaugeMetricFamily(
            LANES_STUCK,
            "Lanes running with an expired lease, or queued longer than the reaper threshold.",
            labels=["state"],
        )
        stuck.add_metric(["running"], float(counts.get("stuck_running", 0)))
        stuck.add_metric(["queued"], float(counts.get("stuck_queued", 0)))
        yield stuck
        yield GaugeMetricFamily(
            DEAD_LETTERED,
            "Dead-lettered lanes (need an operator).",
            value=float(counts.get("dead", 0)),
        )
        yield GaugeMetricFamily(
            REDIS_MEMORY_USED, "Redis used_memory.", value=float(counts.get("redis_memory_used", 0))
        )
        yield GaugeMetricFamily(
            REDIS_MEMORY_MAX,
            "Redis maxmemory (0 = unlimited).",
            value=float(counts.get("redis_maxmemory", 0)),
        )
        yield GaugeMetricFamily(
            REDIS_EVICTING,
            "1 while Redis's maxmemory-policy may evict the fleet's keys (anything but "
            "noeviction) and SOULFLEET_ALLOW_EVICTION is not set, else 0.",
            value=float(counts.get("redis_evicting", 0)),
        )
        yield GaugeMetricFamily(
            MODEL_CALL_OLDEST,
            "Seconds the oldest model call holding a turn-gate slot has been in flight, fleet "
            "wide (0: none; not measured with SOULFLEET_MAX_CONCURRENT_MODEL_CALLS=0).",
            value=float(counts.get("model_call_oldest", 0)),
        )
        yield CounterMetricFamily(
            "soulfleet_inbox_rejects",
            "Posts refused because the lane's inbox was full, fleet-wide (counted in Redis by "
            "whichever process posted; every beat exports the same count).",
            value=float(counts.get("inbox_rejects", 0)),
        )
        yield CounterMetricFamily(
            "soulfleet_redis_evicted_keys",
            "Keys the fleet's Redis evicted since it started (INFO evicted_keys): under an "
            "evicting maxmemory-policy, lane state and inbox items thrown away.",
            value=float(counts.get("redis_evicted_keys", 0)),
        )


#: Seconds between attempts to bind a metrics port that was taken at start.
METRICS_RETRY_EVERY = 10.0


def serve_metrics(
    port: int,
    *,
    host: str = "127.0.0.1",
    collector: Collector | None = None,
    retry_every: float = METRICS_RETRY_EVERY,
) -> bool:
    """Serve ``/metrics`` on ``host:port`` (0 = off); True if it is served from now on.

    A taken port is logged, never fatal, and tried again every ``retry_every`` seconds on a
    daemon thread (0: never): a worker restarted while the old one still shuts down and holds
    the port ran without metrics until its next restart, a blind spot nobody was told of twice.

    Loopback by default (``SOULFLEET_METRICS_HOST``): metrics are not secret, but a port open
    to the network is a choice the operator makes, not a default.
    """
    if collector is not None:
        REGISTRY.register(collector)
    if port <= 0:
        return False
    served = _served(collector)
    try:
        start_http_server(port, addr=host, registry=served)
    except OSError as exc:
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            # Not the port's fault: the host does not resolve, or is no address of this machine.
            _log.error("metrics.host_unavailable", host=host, port=port, error=str(exc),
                       retry_every=retry_every or None,
                       hint="SOULFLEET_METRICS_HOST must name an address of this machine "
                            "(0.0.0.0 for every interface)")  # fmt: skip
        else:
            _log.error("metrics.port_unavailable", host=host, port=port, error=str(exc),
                       retry_every=retry_every or None)  # fmt: skip
        if retry_every > 0:
            threading.Thread(
                target=_serve_later, args=(port, host, retry_every, served),
                name="soulfleet-metrics-retry", daemon=True,
            ).start()  # fmt: skip
        return False
    _log.info("metrics.serving", host=host, port=port)
    return True


def _served(collector: Collector | None) -> CollectorRegistry:
    """What ``/metrics`` shows: this process's registry, or, for a prefork worker, what every
    one of its processes counted, summed (:mod:`workers.metric_files`), and ``collector``."""
    if not shared():
        return REGISTRY
    summed = CollectorRegistry()
    MultiProcessCollector(summed)  # type: ignore[no-untyped-call]
    # The worker's own process and interpreter figures, as its default registry shows them.
    ProcessCollector(registry=summed)
    PlatformCollector(registry=summed)
    if collector is not None:
        summed.register(collector)
    return summed


def _serve_later(port: int, host: str, every: float, served: CollectorRegistry) -> None:
    tries = 1
    while True:
        time.sleep(every)
        tries += 1
        try:
            start_http_server(port, addr=host, registry=served)
        except OSError:
            continue
        _log.info("metrics.serving", host=host, port=port, tries=tries)
        return

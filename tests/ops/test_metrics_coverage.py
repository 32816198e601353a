"""Every metric the dashboard and the alert rules use is one the code exports, and back.

The exported set is built from the live prometheus_client REGISTRY after importing
``workers.metrics`` (counters scrape as ``<name>_total``, histograms as ``_bucket``/``_count``/
``_sum``) plus what :class:`~workers.metrics.LaneStateCollector` yields. A panel or an alert on a
misspelt or wrongly suffixed name would show "no data" forever, silently; these tests make that
a failure instead.
"""

from __future__ import annotations

import re

import pytest

from tests.support.ops import (
    alert_rules,
    dashboard_exprs,
    exported_metrics,
    metric_names,
    selector_labels,
    unknown_metric_names,
)

# Labels Prometheus adds at scrape time.
TARGET_LABELS = {"job", "instance"}

# The metrics issue 5 (item 6) asks an operator to be able to watch.
ISSUE_METRICS = {
    "soulfleet_ticks": "ticks emitted / coalesced",
    "soulfleet_ticks_skipped": "ticks skipped by reason",
    "soulfleet_turns": "turns by kind and status",
    "soulfleet_beats": "surfaced vs silent beats",
    "soulfleet_turn_seconds": "turn latency",
    "soulfleet_model_call_seconds": "model-call latency",
    "soulfleet_lease_losses": "lease losses",
    "soulfleet_inbox_rejects": "inbox rejects",
    "soulfleet_memory_lock_wait_seconds": "memory lock wait",
    "soulfleet_lanes": "lanes by state",
    "soulfleet_sweep_seconds": "sweep duration",
    "soulfleet_sweep_due": "sweep due count",
    "soulfleet_dead_lettered_lanes": "dead-lettered lanes",
}


def _alert_exprs() -> list[str]:
    return [str(rule["expr"]) for rule in alert_rules()]


def _family_of(series: str, families: frozenset[str]) -> str:
    """The family a series belongs to: the longest family name that prefixes it."""
    candidates = [name for name in families if series == name or series.startswith(name + "_")]
    return max(candidates, key=len) if candidates else series


def test_every_alert_metric_is_exported() -> None:
    """Each soulfleet_* series an alert expression reads is one a scrape shows."""
    exprs = _alert_exprs()
    assert any(metric_names(expr) for expr in exprs)
    assert unknown_metric_names(exprs, exported_metrics()) == {}


def test_every_dashboard_metric_is_exported() -> None:
    """Each soulfleet_* series a dashboard target reads is one a scrape shows."""
    exprs = dashboard_exprs()
    assert any(metric_names(expr) for expr in exprs)
    assert unknown_metric_names(exprs, exported_metrics()) == {}


def test_suffix_rules_follow_the_metric_type() -> None:
    """Histograms scrape as _bucket/_count/_sum, counters as _total; other spellings are unknown."""
    exported = exported_metrics()
    good = [
        "rate(soulfleet_turn_seconds_bucket[5m])",
        "soulfleet_turn_seconds_count",
        "soulfleet_turns_total",
        "soulfleet_lanes",
        "soulfleet_redis_maxmemory_bytes",
    ]
    bad = {
        "soulfleet_turns": "a counter has no bare series",
        "soulfleet_turns_bucket": "a counter has no buckets",
        "soulfleet_turn_seconds": "a histogram has no bare series",
        "soulfleet_turn_seconds_total": "a histogram is not a counter",
        "soulfleet_lanes_total": "a gauge is not a counter",
        "soulfleet_sweep_due_bucket": "a gauge has no buckets",
    }
    assert unknown_metric_names(good, exported) == {}
    assert set(unknown_metric_names(bad, exported)) == set(bad)


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_selector_labels_are_labels_the_metric_has(source: str) -> None:
    """A matcher like {state="running"} names a label the series carries (or job/instance)."""
    exported = exported_metrics()
    exprs = _alert_exprs() if source == "alerts" else dashboard_exprs()
    wrong: list[str] = []
    for expr in exprs:
        for series, labels in selector_labels(expr):
            allowed = exported.labels.get(series, frozenset()) | TARGET_LABELS
            wrong += [f"{series}{{{label}}} in {expr!r}" for label in labels - allowed]
    assert wrong == []


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_grouping_labels_exist_on_the_metrics_grouped(source: str) -> None:
    """`by (...)` groups on labels the expression's soulfleet series carry (or le/job/instance)."""
    exported = exported_metrics()
    exprs = _alert_exprs() if source == "alerts" else dashboard_exprs()
    wrong: list[str] = []
    for expr in exprs:
        series = metric_names(expr)
        if not series:
            continue
        allowed = set(TARGET_LABELS)
        for name in series:
            allowed |= exported.labels.get(name, frozenset())
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            labels = {label.strip() for label in group.split(",") if label.strip()}
            wrong += [f"by ({label}) in {expr!r}" for label in labels - allowed]
    assert wrong == []


def test_the_dashboard_shows_every_metric_the_issue_names() -> None:
    """Ticks, turns, beats, latencies, lease losses, rejects, lock wait, lanes, sweeps, dead."""
    exported = exported_metrics()
    shown = {
        _family_of(series, exported.families)
        for expr in dashboard_exprs()
        for series in metric_names(expr)
    }
    missing = {name: what for name, what in ISSUE_METRICS.items() if name not in shown}
    assert missing == {}


def test_every_exported_metric_is_watched_somewhere() -> None:
    """Each metric family the code exports appears on the dashboard or in an alert."""
    exported = exported_metrics()
    used = {
        _family_of(series, exported.families)
        for expr in [*dashboard_exprs(), *_alert_exprs()]
        for series in metric_names(expr)
    }
    assert set(ISSUE_METRICS) <= exported.families
    assert exported.families - used == set()

"""Readers for the ops/ files (compose, Prometheus, Grafana, runbook) and the metric names.

The ops tests check that the deployment files and the code tell one story: the queues compose
serves are the queues the code declares, every metric a dashboard panel or an alert uses is one
the code exports, every alert's runbook link lands on a runbook section. These helpers parse
the files once, the way their real consumers do (YAML, JSON, PromQL identifiers).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY, Metric

from beat import metrics as beat_metrics
from workers import metrics

__all__ = [
    "ALERTS",
    "COMPOSE",
    "DASHBOARD",
    "DOCKERFILE",
    "DOCKERIGNORE",
    "OPS",
    "PROMETHEUS",
    "REPO",
    "RUNBOOK",
    "Exported",
    "alert_rules",
    "dashboard_exprs",
    "exported_metrics",
    "github_anchor",
    "load_yaml",
    "metric_names",
    "runbook_anchors",
    "selector_labels",
    "unknown_metric_names",
]

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "ops"
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = OPS / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PROMETHEUS = OPS / "prometheus" / "prometheus.yml"
ALERTS = OPS / "prometheus" / "alerts.yml"
DASHBOARD = OPS / "grafana" / "dashboards" / "soulfleet.json"
RUNBOOK = OPS / "runbook.md"

# A PromQL metric name starting with the fleet's namespace. Job names ("soulfleet-beat") and
# datasource uids use a hyphen, so they never match.
_METRIC = re.compile(r"\bsoulfleet_[A-Za-z0-9_:]+")
_SELECTOR = re.compile(r"\b(soulfleet_[A-Za-z0-9_:]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")

# What a scrape of each metric type shows (prometheus_client's exposition).
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@dataclass(frozen=True)
class Exported:
    """The soulfleet series names a scrape can show, each with the label names it may carry."""

    labels: dict[str, frozenset[str]]
    families: frozenset[str]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.labels)


def _family_series(family: Metric, labelnames: Iterable[str]) -> Iterator[tuple[str, set[str]]]:
    for suffix in _SUFFIXES[family.type]:
        labels = set(labelnames)
        if suffix == "_bucket":
            labels.add("le")
        yield family.name + suffix, labels


def exported_metrics() -> Exported:
    """Series names exported by the live registry after importing ``workers.metrics`` and
    ``beat.metrics`` (beat's scrape shows both), plus the
    gauges :class:`~workers.metrics.LaneStateCollector` yields (beat registers it at run time).

    Label names come from the metric objects (a labelled metric with no children yet has no
    samples to read them from) and, for the collector, from the samples it yields.
    """
    declared: dict[str, tuple[str, ...]] = {}
    for value in [*vars(metrics).values(), *vars(beat_metrics).values()]:
        name = getattr(value, "_name", None)
        labelnames = getattr(value, "_labelnames", None)
        if isinstance(name, str) and isinstance(labelnames, tuple):
            declared[name] = tuple(str(label) for label in labelnames)

    labels: dict[str, frozenset[str]] = {}
    families: set[str] = set()
    for family in REGISTRY.collect():
        if not family.name.startswith("soulfleet_"):
            continue
        families.add(family.name)
        for series, names in _family_series(family, declared.get(family.name, ())):
            labels[series] = frozenset(names)

    collector = metrics.LaneStateCollector(lambda: dict.fromkeys(metrics.COUNT_KEYS, 1))
    for family in collector.collect():
        families.add(family.name)
        sample_labels = {label for sample in family.samples for label in sample.labels}
        for series, names in _family_series(family, sample_labels):
            labels[series] = frozenset(names)
    return Exported(labels=labels, families=frozenset(families))


def metric_names(expr: str) -> set[str]:
    """Every ``soulfleet_*`` series name a PromQL expression reads."""
    return set(_METRIC.findall(expr))


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """``(series, label names matched)`` for each ``soulfleet_x{...}`` selector in ``expr``."""
    return [(name, set(_MATCHER.findall(body))) for name, body in _SELECTOR.findall(expr)]


def unknown_metric_names(exprs: Iterable[str], exported: Exported) -> dict[str, set[str]]:
    """Expression -> the series names in it that no scrape would show."""
    unknown: dict[str, set[str]] = {}
    for expr in exprs:
        missing = metric_names(expr) - exported.names
        if missing:
            unknown[expr] = missing
    return unknown


def alert_rules() -> list[dict[str, Any]]:
    """Every alerting rule in ops/prometheus/alerts.yml, in file order."""
    document = load_yaml(ALERTS)
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard_exprs(dashboard: dict[str, Any] | None = None) -> list[str]:
    """Every PromQL target of the dashboard (rows' nested panels included)."""
    if dashboard is None:
        dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))

    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            for target in panel.get("targets", []):
                if "expr" in target:
                    yield str(target["expr"])
            yield from walk(panel.get("panels", []))

    return list(walk(dashboard["panels"]))


def github_anchor(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def runbook_anchors() -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", RUNBOOK.read_text(encoding="utf-8"), re.M)
    return {github_anchor(heading) for heading in headings}

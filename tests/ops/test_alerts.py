"""ops/prometheus: the alert rules are well-formed, point at the runbook, and fire when meant to.

The rules, the scrape config and the alert unit tests in ``alerts_test.yml`` run through
Prometheus's own checker, ``promtool`` (on PATH, or taken from Debian's ``prometheus`` package by
tests/support/tools.py); without it the promtool test fails rather than passing on structure alone.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.ops import (
    ALERTS,
    DASHBOARD,
    PROMETHEUS,
    alert_rules,
    dashboard_exprs,
    load_yaml,
    runbook_anchors,
)
from tests.support.tools import ToolMissing
from tests.support.tools import promtool as find_promtool

ALERT_TESTS = ALERTS.parent / "alerts_test.yml"
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
SEVERITIES = {"critical", "warning"}
RUNBOOK_LINK = re.compile(r"^ops/runbook\.md#([a-z0-9-]+)$")


def _rule(name: str) -> dict[str, Any]:
    matches = [rule for rule in alert_rules() if rule["alert"] == name]
    assert len(matches) == 1, name
    return matches[0]


def test_every_rule_has_expr_for_severity_summary_and_runbook() -> None:
    """Each alert has expr, a `for` duration, labels.severity, a summary, a description, a link."""
    rules = alert_rules()
    assert rules
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Soulfleet[A-Z][A-Za-z]+", name), name
        assert str(rule["expr"]).strip(), name
        assert DURATION.match(str(rule["for"])), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert str(annotations["summary"]).strip(), name
        assert str(annotations["description"]).strip(), name
        assert RUNBOOK_LINK.match(str(annotations["runbook_url"])), name


def test_alert_names_are_unique() -> None:
    """No two rules share a name (Alertmanager would merge them)."""
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))


def test_every_runbook_link_lands_on_a_runbook_section() -> None:
    """Each runbook_url anchor is the anchor of a heading in ops/runbook.md."""
    anchors = runbook_anchors()
    for rule in alert_rules():
        match = RUNBOOK_LINK.match(str(rule["annotations"]["runbook_url"]))
        assert match is not None
        assert match.group(1) in anchors, rule["alert"]


def test_the_alerts_the_issue_asks_for_watch_the_right_metrics() -> None:
    """Stuck running, dead-lettered, failure rate, beat not sweeping, Redis memory near limit."""
    stuck = _rule("SoulfleetLaneStuckRunning")
    assert "soulfleet_lanes_stuck" in stuck["expr"]
    assert 'state="running"' in stuck["expr"]
    assert stuck["for"] == "5m"
    assert "soulfleet_dead_lettered_lanes" in _rule("SoulfleetDeadLetteredLanes")["expr"]
    failures = str(_rule("SoulfleetTurnFailureRate")["expr"])
    assert 'soulfleet_turns_total{status="error"}' in failures
    assert "[10m]" in failures
    sweeping = str(_rule("SoulfleetBeatNotSweeping")["expr"])
    assert "time() - max(soulfleet_last_sweep_timestamp_seconds" in sweeping
    assert "absent(soulfleet_last_sweep_timestamp_seconds" in sweeping
    memory = str(_rule("SoulfleetRedisMemoryHigh")["expr"])
    assert "soulfleet_redis_memory_used_bytes" in memory
    assert "soulfleet_redis_maxmemory_bytes" in memory
    assert "> 0)" in memory


def test_job_names_used_are_scrape_jobs() -> None:
    """Every job="..." in alerts and dashboard is a job prometheus.yml scrapes."""
    jobs = {job["job_name"] for job in load_yaml(PROMETHEUS)["scrape_configs"]}
    used: set[str] = set()
    for expr in [*(str(rule["expr"]) for rule in alert_rules()), *dashboard_exprs()]:
        used |= set(re.findall(r'\bjob="([^"]+)"', expr))
    assert used
    assert used <= jobs


def test_prometheus_config_loads_the_alert_rules() -> None:
    """prometheus.yml's rule_files resolve (beside it, as in the container) to alerts.yml."""
    config = load_yaml(PROMETHEUS)
    rule_files = [PROMETHEUS.parent / name.split("#")[0].strip() for name in config["rule_files"]]
    assert ALERTS in rule_files
    assert all(path.is_file() for path in rule_files)


def _structural_check_of_alert_tests() -> None:
    """What promtool's unit tests would need: each tested alert exists, links match the rule."""
    document = load_yaml(ALERT_TESTS)
    assert document["rule_files"] == [ALERTS.name]
    tested = 0
    for case in document["tests"]:
        for check in case["alert_rule_test"]:
            rule = _rule(check["alertname"])
            tested += 1
            for expected in check["exp_alerts"]:
                assert expected["exp_labels"]["severity"] == rule["labels"]["severity"]
                annotations = expected["exp_annotations"]
                assert annotations["runbook_url"] == rule["annotations"]["runbook_url"]
    assert tested > 0


def _promtool(promtool: str, *args: str, cwd: Path) -> None:
    result = subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_promtool_accepts_config_rules_dashboard_queries_and_alert_tests(tmp_path: Path) -> None:
    """promtool checks the config and rules, parses every panel query, runs alerts_test.yml."""
    _structural_check_of_alert_tests()
    try:
        promtool = find_promtool()
    except ToolMissing as exc:
        pytest.fail(str(exc))
    _promtool(promtool, "check", "config", str(PROMETHEUS), cwd=tmp_path)
    _promtool(promtool, "check", "rules", str(ALERTS), cwd=tmp_path)
    _promtool(promtool, "test", "rules", str(ALERT_TESTS), cwd=ALERTS.parent)
    # Dashboard queries as recording rules: promtool parses each one as PromQL.
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for index, expr in enumerate(dashboard_exprs()):
        concrete = expr.replace("$__rate_interval", "1m")
        lines += [
            f"      - record: dashboard:query_{index}",
            f"        expr: {json.dumps(concrete)}",
        ]
    queries = tmp_path / "dashboard_queries.yml"
    queries.write_text("\n".join(lines) + "\n")
    assert DASHBOARD.is_file()
    _promtool(promtool, "check", "rules", str(queries), cwd=tmp_path)

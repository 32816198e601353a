"""ops/grafana: a dashboard Grafana can provision, wired to the provisioned datasource.

Grafana loads ``soulfleet.json`` from the directory docker-compose mounts, through the provider
in ``provisioning/dashboards``; every panel queries the datasource whose uid
``provisioning/datasources`` fixes. A mismatch anywhere is a dashboard of empty panels.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.ops import COMPOSE, DASHBOARD, OPS, dashboard_exprs, load_yaml

PROVISIONING = OPS / "grafana" / "provisioning"


def _dashboard() -> dict[str, Any]:
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    flat: list[dict[str, Any]] = []
    for panel in panels:
        flat.append(panel)
        flat += _panels(panel.get("panels", []))
    return flat


def _datasource_uid() -> str:
    files = sorted((PROVISIONING / "datasources").glob("*.yml"))
    assert files
    sources = [source for path in files for source in load_yaml(path)["datasources"]]
    prometheus = [source for source in sources if source["type"] == "prometheus"]
    assert len(prometheus) == 1
    return str(prometheus[0]["uid"])


def test_dashboard_is_provisionable_json() -> None:
    """A uid, a title, a schema version, and panels with unique ids."""
    dashboard = _dashboard()
    assert dashboard["uid"] == "soulfleet"
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)) > 0


def test_every_query_uses_the_provisioned_datasource() -> None:
    """Each panel and target points at the datasource uid provisioning creates."""
    uid = _datasource_uid()
    for panel in _panels(_dashboard()["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid, panel["title"]
        targets = panel["targets"]
        assert targets, panel["title"]
        ref_ids = [target["refId"] for target in targets]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in targets:
            assert target["datasource"]["uid"] == uid, panel["title"]
            assert str(target["expr"]).strip(), panel["title"]


def test_panels_fit_the_grid_without_overlapping() -> None:
    """Every panel lies within Grafana's 24 columns and no two panels share a cell."""
    taken: dict[tuple[int, int], str] = {}
    for panel in _panels(_dashboard()["panels"]):
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["w"] > 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


def test_queries_are_balanced() -> None:
    """Brackets and quotes balance in every query (promtool parses them fully when installed)."""
    pairs = {")": "(", "]": "[", "}": "{"}
    for expr in dashboard_exprs():
        stack: list[str] = []
        for char in expr:
            if char in "([{":
                stack.append(char)
            elif char in pairs:
                assert stack, expr
                assert stack.pop() == pairs[char], expr
        assert stack == [], expr
        assert expr.count('"') % 2 == 0, expr


def test_provider_path_is_where_compose_mounts_the_dashboards() -> None:
    """The dashboard provider reads the directory compose mounts ops/grafana/dashboards on."""
    providers = load_yaml(PROVISIONING / "dashboards" / "soulfleet.yml")["providers"]
    paths = {str(provider["options"]["path"]) for provider in providers}
    grafana = load_yaml(COMPOSE)["services"]["grafana"]
    mounts = {
        str(volume).split(":")[1]
        for volume in grafana["volumes"]
        if str(volume).split(":")[0] == "./ops/grafana/dashboards"
    }
    assert paths == mounts != set()

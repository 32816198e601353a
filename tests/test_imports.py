"""The house's import graph: no circles between modules, and floors that only point down.

Read from the source with :mod:`ast` (nothing is imported), counting every import, including
those inside functions and under ``TYPE_CHECKING``: a lazy import is still an arrow a reader has
to follow, and a circle hidden in a function is still a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support.imports import cycles, import_graph

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("workers", "beat")


def _graph() -> dict[str, set[str]]:
    return import_graph(REPO, PACKAGES)


def _arrows(graph: dict[str, set[str]]) -> Iterator[tuple[str, str]]:
    for source, targets in graph.items():
        for target in targets:
            yield source, target


def test_the_house_has_no_import_circles() -> None:
    """No two modules of workers/ or beat/ import each other, directly or round a loop."""
    found = cycles(_graph())
    assert found == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_floors_point_down_beat_then_workers_then_the_persona_core() -> None:
    """beat may import workers; workers never imports beat; workers.persona imports nothing of
    the rest of the house (it is the pure core the fleet and library users share)."""
    back = [
        (source, target)
        for source, target in _arrows(_graph())
        if (source.startswith("workers") and target.startswith("beat"))
        or (
            source.startswith("workers.persona")
            and target.startswith("workers")
            and not target.startswith("workers.persona")
        )
    ]
    assert back == []


def test_the_fleet_wing_never_imports_celery_or_the_celery_glue() -> None:
    """workers.fleet coordinates through Redis and is handed its publisher: no arrow from it to
    Celery, kombu or the top-level Celery glue (app, celery, tasks, runtime, turn, publisher)."""
    glue = {"workers.app", "workers.celery", "workers.tasks", "workers.runtime", "workers.turn"}
    glue |= {"workers.publisher", "workers.broker", "workers.turn_messages"}
    offenders = []
    for path in sorted((REPO / "workers" / "fleet").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                in_glue = any(name == g or name.startswith(f"{g}.") for g in glue)
                if name.split(".")[0] in {"celery", "kombu"} or in_glue:
                    offenders.append((path.relative_to(REPO).as_posix(), name))
    assert offenders == []


def test_the_cycle_finder_finds_a_planted_circle(tmp_path: Path) -> None:
    """The check itself works: a two-module loop and a loop through a lazy import are found."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from pkg import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]

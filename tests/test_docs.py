"""The project's documents live in the repository: every link resolves inside it."""

from __future__ import annotations

import inspect
import re
import subprocess
from pathlib import Path

from workers.persona import compose_soul

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", REPO / "ops" / "runbook.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    suffixes = {".py", ".md", ".toml", ".yml", ".yaml", ".lua", ".json", ".cfg", ""}
    return [REPO / name for name in listed if Path(name).suffix in suffixes]


def test_every_relative_link_in_the_documents_resolves_inside_the_repository() -> None:
    """A link in README.md, docs/ or the runbook names a file that exists in this checkout."""
    broken = []
    for document in DOCUMENTS:
        for target in LINK.findall(document.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (document.parent / target).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append((document.relative_to(REPO).as_posix(), target))
    assert broken == []


def test_nothing_in_the_repository_points_at_the_design_inputs_outside_it() -> None:
    """The design inputs the project started from are not part of it: no file cites them."""
    outside = re.compile(r"DESIGN\.md|CONTRACT\.md|\.\./shared/|shared/seeds")
    citing = [
        path.relative_to(REPO).as_posix()
        for path in _tracked_text_files()
        if path.is_file()
        and path.name != Path(__file__).name
        and outside.search(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert citing == []


def test_compose_soul_is_documented_with_its_real_signature() -> None:
    """README.md and docs/persona.md state `compose_soul`'s parameters; both must say what the
    function takes (a `*` in one of them would tell a caller that positional options fail)."""

    def shape(text: str) -> list[str]:
        return [part.strip().split("=")[0].strip() for part in text.split(",")]

    real = list(inspect.signature(compose_soul).parameters)
    for document in (REPO / "README.md", REPO / "docs" / "persona.md"):
        found = re.search(r"`compose_soul\(([^)]*)\)", document.read_text(encoding="utf-8"))
        assert found is not None, document
        documented = shape(found.group(1))
        documented[0] = "path"  # the docs call it dir
        assert documented == real, (document.name, documented, real)

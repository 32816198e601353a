"""README.md stays true: every setting is in its table, and CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
VARIABLE = re.compile(
    r'"((?:SOULFLEET|OPENAI|ANTHROPIC)_[A-Z_]+|REDIS_URL|CELERY_BROKER_URL|FLOWER_BASIC_AUTH)"'
)


def _read_by_code() -> set[str]:
    sources = [
        REPO / "workers" / "settings.py",
        REPO / "workers" / "persona" / "models" / "config.py",
        # Where `up` keeps its data and other commands find it: read before any settings.
        REPO / "workers" / "local" / "datadir.py",
        # Flower's password, for `up --flower` (compose hands it to Flower itself).
        REPO / "workers" / "cli" / "launch.py",
    ]
    return {name for path in sources for name in VARIABLE.findall(path.read_text("utf-8"))}


def test_every_environment_variable_the_code_reads_is_in_the_configuration_table() -> None:
    """A variable added to the settings without a README row fails here."""
    table = README[README.index("## Configuration") : README.index("## Command line")]
    rows = set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.MULTILINE))
    read = _read_by_code()
    assert len(read) > 30
    assert read <= rows, f"missing from the README table: {sorted(read - rows)}"
    assert rows <= read, f"documented but never read: {sorted(rows - read)}"


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run calls exactly the install-and-test command the README gives."""
    block = README[README.index("Install and run the tests") :]
    command = re.search(r"```sh\n(.+?)\n```", block, re.DOTALL)
    assert command is not None
    readme_command = command.group(1).strip()
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert readme_command in ci


def test_readme_and_docs_never_use_the_runbooks_sf_shorthand() -> None:
    """`sf` is an alias the runbook defines for its own pages (`docker-compose exec worker
    soulfleet`); a newcomer reading README.md or docs/ has no such command, so they spell it
    `soulfleet`."""
    documents = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    using = [
        f"{path.relative_to(REPO).as_posix()}:{number}"
        for path in documents
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"`sf ", line)
    ]
    assert using == []

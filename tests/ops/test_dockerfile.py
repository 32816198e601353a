"""ops/Dockerfile and .dockerignore: a slim non-root image built from exactly what it needs.

There is no Docker engine in CI, so the image is checked in two ways: its instructions are read
for the properties that matter (base, user, no dev extras, no pip cache, health check, default
command), and the build context that .dockerignore would send is reproduced and actually built
into a wheel with pip, the way the Dockerfile's ``pip install .`` builds it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.ops import DOCKERFILE, DOCKERIGNORE, REPO
from workers.queues import declare_queues
from workers.settings import Settings


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    pairs = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        pairs.append((keyword.upper(), rest.strip()))
    return pairs


def _args() -> dict[str, str]:
    found = {}
    for keyword, rest in _instructions():
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            found[name] = value
    return found


def _substitute(text: str) -> str:
    args = _args()
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), ""), text)


def test_base_is_python_3_11_slim() -> None:
    """One stage, FROM python:3.11-slim."""
    froms = [rest for keyword, rest in _instructions() if keyword == "FROM"]
    assert froms == ["python:3.11-slim"]


def test_runs_as_a_dedicated_non_root_uid() -> None:
    """USER is a fixed numeric uid other than 0, created with useradd, set after the install."""
    instructions = _instructions()
    users = [index for index, (keyword, _) in enumerate(instructions) if keyword == "USER"]
    assert len(users) == 1
    uid = _substitute(instructions[users[0]][1]).split(":")[0]
    assert uid.isdigit()
    assert int(uid) >= 1000
    runs = [_substitute(rest) for keyword, rest in instructions[: users[0]] if keyword == "RUN"]
    assert any(re.search(rf'useradd .*--uid "?{uid}"?\s', run) for run in runs)
    assert any("pip install" in run for run in runs), "install as root, run as the user"


def test_installs_the_project_without_dev_extras_or_pip_cache() -> None:
    """`pip install .` with --no-cache-dir; no [dev] extras, no editable install."""
    installs = [rest for keyword, rest in _instructions() if keyword == "RUN" and "pip" in rest]
    assert len(installs) == 1
    install = installs[0]
    assert re.search(r"pip install --no-cache-dir \.(\s|$)", install)
    assert "[dev" not in install
    assert " -e " not in install


def test_checks_timezone_data_at_build() -> None:
    """The build fails unless zoneinfo finds a real zone (the tzdata wheel; slim has none)."""
    install = next(rest for keyword, rest in _instructions() if keyword == "RUN" and "pip" in rest)
    assert "zoneinfo.ZoneInfo(" in install


def test_has_a_healthcheck_and_a_worker_default_command() -> None:
    """HEALTHCHECK pings this worker; CMD runs a thread-pool worker on the declared queues, at
    the settings' concurrency (no ``-c`` to override SOULFLEET_WORKER_CONCURRENCY's 200)."""
    instructions = dict(_instructions())
    assert "inspect ping" in instructions["HEALTHCHECK"]
    command = re.findall(r'"([^"]*)"', instructions["CMD"])
    assert command[:4] == ["celery", "-A", "workers", "worker"]
    assert command[command.index("-P") + 1] == "threads"
    assert "-c" not in command
    assert "--concurrency" not in command
    queues = set(command[command.index("-Q") + 1].split(","))
    assert queues == {queue.name for queue in declare_queues(Settings().queue_prefix)}


def _ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (is_exception, regex) rules, in order (the last match wins)."""
    rules = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        regex = ""
        index = 0
        while index < len(pattern):
            if pattern.startswith("**", index):
                regex += ".*"
                index += 2
                if pattern.startswith("/", index):
                    regex += "/?"
                    index += 1
                continue
            char = pattern[index]
            regex += {"*": "[^/]*", "?": "[^/]"}.get(char, re.escape(char))
            if char == "[":
                end = pattern.index("]", index)
                regex = regex[: -len(re.escape(char))] + pattern[index : end + 1]
                index = end
            index += 1
        rules.append((negate, re.compile(f"^{regex}$")))
    return rules


def _excluded(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: a pattern matching the path or any parent directory applies."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: index + 1]) for index in range(len(parts))]
    excluded = False
    for negate, regex in rules:
        if any(regex.match(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_out_everything_but_the_sources() -> None:
    """The context has the package sources, and never the venv, .git, tests, .env or data."""
    rules = _ignore_rules()
    for kept in (
        "pyproject.toml",
        "README.md",
        "workers/fleet/host.py",
        "workers/fleet/lua/start.lua",
        "beat/__init__.py",
        "ops/healthcheck.py",
    ):
        assert not _excluded(kept, rules), kept
    for dropped in (
        ".venv/bin/python",
        ".git/config",
        "tests/conftest.py",
        ".env",
        "personas/ava/SOUL.md",
        "data/dump.rdb",
        "ops/runbook.md",
        "workers/__pycache__/fleet.cpython-311.pyc",
        "docker-compose.yml",
    ):
        assert _excluded(dropped, rules), dropped


def _context_copy(destination: Path) -> None:
    """Reproduce what the Dockerfile's COPY lines put in /src, from the filtered context.

    Only the forms the Dockerfile uses: files into a directory (``COPY a b ./``) and a
    directory into a directory (``COPY workers ./workers``).
    """
    rules = _ignore_rules()
    workdir = None
    for keyword, rest in _instructions():
        if keyword == "WORKDIR":
            workdir = rest
        if keyword != "COPY":
            continue
        *sources, target = rest.split()
        for source in sources:
            path = REPO / source
            assert path.exists(), f"COPY {source}: not in the repository"
            assert not _excluded(source, rules), f"COPY {source}: .dockerignore drops it"
        if target.startswith("/") or workdir != "/src":
            continue  # outside the source tree pip builds from
        base = destination / target
        for source in sources:
            path = REPO / source
            if path.is_file():
                assert target.endswith("/"), f"COPY {source} {target}"
                pairs = [(path, base / path.name)]
            else:
                pairs = [(p, base / p.relative_to(path)) for p in path.rglob("*") if p.is_file()]
            for file, out in pairs:
                if _excluded(file.relative_to(REPO).as_posix(), rules):
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, out)


@pytest.mark.integration
def test_the_build_context_builds_a_complete_wheel(tmp_path: Path) -> None:
    """pip builds the project from exactly the copied context, Lua scripts and data included."""
    source = tmp_path / "src"
    source.mkdir()
    _context_copy(source)
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(wheels),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    built = list(wheels.glob("soulfleet-*.whl"))
    assert len(built) == 1
    names = set(zipfile.ZipFile(built[0]).namelist())
    shipped = {
        path.relative_to(REPO).as_posix()
        for package in ("workers", "beat")
        for path in (REPO / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert {"workers/fleet/lua/start.lua", "workers/persona/models/default_script.toml"} <= shipped
    assert shipped - names == set()
    assert not any(name.startswith("tests/") for name in names)

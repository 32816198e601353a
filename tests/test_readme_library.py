"""The README's library example runs as written, from a fresh clone of the repository."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _library_section() -> str:
    for path in DOCS:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        if "### Using a persona as a library" in text:
            section = text[text.index("### Using a persona as a library") :]
            return section[: section.find("\n#", 1)] if "\n#" in section[1:] else section
    raise AssertionError("no 'Using a persona as a library' section in README.md or docs/")


def _fresh_clone(target: Path) -> Path:
    """The tracked files as they are in this checkout (what a clone of it would hold)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.mark.integration
def test_the_library_example_runs_as_written_from_a_fresh_clone(tmp_path: Path) -> None:
    """Its shell lines, then its Python block, in a fresh copy of the repository (no personas/
    there to begin with): the one-shot turn finishes with status done."""
    section = _library_section()
    shell = re.findall(r"```sh\n(.+?)\n```", section, re.DOTALL)
    python = re.findall(r"```python\n(.+?)\n```", section, re.DOTALL)
    assert len(python) == 1, section
    assert 'run("personas/ava"' in python[0]
    clone = _fresh_clone(tmp_path / "soulfleet")
    assert not (clone / "personas").exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOULFLEET_", "OPENAI_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for block in shell:
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=clone, env=env,
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert ran.returncode == 0, (block, ran.stderr)
    code = python[0] + '\nprint("STATUS", result.status)\n'
    ran = subprocess.run([sys.executable, "-c", code], cwd=clone, env=env,
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "STATUS done" in ran.stdout, ran.stdout + ran.stderr

"""`soulfleet init DIR`: a self-explaining persona home, never overwriting anything."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from workers.cli.init import SCAFFOLD_FILES
from workers.persona.home import BOOTSTRAP_ORDER, compose_soul
from workers.persona.manifest import PersonaConfig, load_manifest, parse_manifest
from workers.persona.spend import heartbeat_blank
from workers.persona.tool_config import McpDecl

_KEYS = ("does", "model", "memory", "notes", "memory_index_cap", "every", "active_hours",
         "cron", "timezone", "window", "instructions", "idle_after", "idle_every",
         "daily_tokens", "on_exceed")  # fmt: skip


def test_init_writes_every_bootstrap_file_with_a_role_comment(
    invoke: Invoke, tmp_path: Path
) -> None:
    """Every bootstrap file, persona.toml and DREAM.md are written; each .md opens with a comment
    on its role."""
    home = tmp_path / "kai"
    result = invoke("init", str(home))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in home.iterdir()) == sorted(SCAFFOLD_FILES)
    for name in (*BOOTSTRAP_ORDER, "DREAM.md"):
        text = (home / name).read_text(encoding="utf-8")
        assert text.startswith(f"<!-- {name}:"), name
    assert "Name: kai" in (home / "IDENTITY.md").read_text(encoding="utf-8")
    soul, found = compose_soul(home)
    assert found == list(BOOTSTRAP_ORDER)
    assert "## SOUL.md" in soul


def test_init_persona_toml_is_valid_and_documents_every_key(invoke: Invoke, tmp_path: Path) -> None:
    """The scaffolded persona.toml parses, and every schema key appears with a comment above it."""
    home = tmp_path / "kai"
    assert invoke("init", str(home)).exit_code == 0
    config = load_manifest(home)
    assert isinstance(config, PersonaConfig)
    assert config.heartbeat is not None
    assert config.dream is not None
    text = (home / "persona.toml").read_text(encoding="utf-8")
    tomllib.loads(text)
    lines = text.splitlines()
    for key in _KEYS:
        at = next(i for i, line in enumerate(lines) if line.lstrip("# ").startswith(f"{key} ="))
        assert lines[at - 1].startswith("#"), f"{key} has no comment above it"


def test_init_heartbeat_costs_nothing_until_a_task_is_written(
    invoke: Invoke, tmp_path: Path
) -> None:
    """The scaffolded HEARTBEAT.md is blank by the spend rule (beats skipped as blank_heartbeat,
    no model call), and explains how to change that; one written task makes it actionable."""
    home = tmp_path / "kai"
    assert invoke("init", str(home)).exit_code == 0
    path = home / "HEARTBEAT.md"
    text = path.read_text(encoding="utf-8")
    assert heartbeat_blank(text)
    assert "blank_heartbeat" in text
    assert not heartbeat_blank(text + "- remind me to stretch\n")


def test_init_refuses_to_overwrite_and_writes_nothing(invoke: Invoke, tmp_path: Path) -> None:
    """An existing bootstrap file makes init fail (exit 2, one line naming it) and write nothing."""
    home = tmp_path / "kai"
    home.mkdir()
    (home / "SOUL.md").write_text("mine", encoding="utf-8")
    result = invoke("init", str(home))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "refusing to overwrite" in result.stderr
    assert "SOUL.md" in result.stderr
    assert [p.name for p in home.iterdir()] == ["SOUL.md"]
    assert (home / "SOUL.md").read_text(encoding="utf-8") == "mine"


def test_init_refuses_a_dangling_symlink_at_a_name_and_writes_nothing(
    invoke: Invoke, tmp_path: Path
) -> None:
    """A dangling symlink at SOUL.md passed the check (`exists` follows it) and init failed
    half-way (`File exists`, exit 1) with AGENTS.md written: refused up front, exit 2."""
    home = tmp_path / "kai"
    home.mkdir()
    (home / "SOUL.md").symlink_to(tmp_path / "nowhere")
    result = invoke("init", str(home))
    assert result.exit_code == 2, result.output
    assert "refusing to overwrite existing files" in result.stderr
    assert "SOUL.md" in result.stderr
    assert [p.name for p in home.iterdir()] == ["SOUL.md"]
    assert not (tmp_path / "nowhere").exists()


def test_init_into_an_empty_existing_directory(invoke: Invoke, tmp_path: Path) -> None:
    """An existing empty directory is fine: init fills it."""
    home = tmp_path / "empty"
    home.mkdir()
    assert invoke("init", str(home)).exit_code == 0
    assert (home / "persona.toml").is_file()


def test_init_shows_a_commented_tools_example_that_parses(invoke: Invoke, tmp_path: Path) -> None:
    """The scaffold carries a commented [[tools.mcp]] example; uncommented, it is valid."""
    home = tmp_path / "kai"
    assert invoke("init", str(home)).exit_code == 0
    text = (home / "persona.toml").read_text(encoding="utf-8")
    assert load_manifest(home).tools.entries == ()
    assert "# [[tools.mcp]]" in text
    example = text[text.index("# [[tools.mcp]]") :].split("\n#\n")[0]
    uncommented = "\n".join(line.removeprefix("# ") for line in example.splitlines())
    [decl] = parse_manifest(uncommented).tools.entries
    assert isinstance(decl, McpDecl)
    assert decl.name == "time"
    assert decl.server is not None
    assert decl.server.command == "mcp-server-time"
    assert decl.allow == ("get_current_time",)


def test_init_under_a_file_is_bad_input_naming_it(invoke: Invoke, tmp_path: Path) -> None:
    """DIRECTORY under a regular file: exit 2 (bad input, not a failure) naming the path,
    nothing written."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory\n")
    result = invoke("init", str(blocker / "ava"))
    assert result.exit_code == 2, result.output
    assert f"{blocker} is a file, not a directory" in result.stderr
    assert blocker.read_text() == "not a directory\n"


def test_init_refuses_an_empty_directory_argument(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`soulfleet init ""` (an unset shell variable) wrote nine files into the current
    directory: refused, exit 2, nothing written."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    result = invoke("init", "")
    assert result.exit_code == 2, result.output
    assert "DIRECTORY is empty" in result.stderr
    assert list(here.iterdir()) == []


def test_init_refuses_a_personas_root_and_a_persona_inside_another(
    invoke: Invoke, fleet_root: Path, tmp_path: Path
) -> None:
    """`init` on the fleet's personas root (or any directory holding personas) made the root a
    persona, whose sessions/ and transcripts/ the fleet then took for personas of their own;
    inside a persona it mixed two personas' files. Both are refused, nothing written; the
    message names the directory to use instead."""
    before = sorted(p.name for p in fleet_root.iterdir())
    result = invoke("init", str(fleet_root))
    assert result.exit_code == 2, result.output
    assert "is the personas root the fleet serves" in result.stderr
    other = tmp_path / "elsewhere"
    (other / "bob").mkdir(parents=True)
    (other / "bob" / "SOUL.md").write_text("You are bob.\n")
    result = invoke("init", str(other))
    assert result.exit_code == 2, result.output
    assert "holds personas (bob): it is a personas root" in result.stderr
    result = invoke("init", str(fleet_root / "ava" / "sub"))
    assert result.exit_code == 2, result.output
    assert f"is inside the persona {fleet_root / 'ava'}" in result.stderr
    assert sorted(p.name for p in fleet_root.iterdir()) == before
    assert not (fleet_root / "persona.toml").exists()
    assert not (other / "persona.toml").exists()
    assert not (fleet_root / "ava" / "sub").exists()


def test_init_outside_the_fleets_root_says_the_fleet_will_not_schedule_it(
    invoke: Invoke, fleet_root: Path, tmp_path: Path
) -> None:
    """A persona made outside the root the fleet serves is created, with a note saying the
    fleet does not schedule it there; under the root, no such note."""
    result = invoke("init", str(tmp_path / "loner"))
    assert result.exit_code == 0, result.output
    assert f"is not under the personas root {fleet_root.resolve()}" in result.stderr
    result = invoke("init", str(fleet_root / "newbie"))
    assert result.exit_code == 0, result.output
    assert "not under the personas root" not in result.stderr
    # an unusable name outside the root: both notes (the second was left out)
    result = invoke("init", str(tmp_path / "my persona"))
    assert result.exit_code == 0, result.output
    assert "is not a usable persona name" in result.stderr
    assert "is not under the personas root" in result.stderr

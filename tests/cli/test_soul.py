"""`soulfleet soul DIR`: the composed soul exactly as a turn reads it, and the found list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from workers.persona.home import compose_soul


def test_soul_prints_the_composed_soul_on_stdout(invoke: Invoke, fleet_root: Path) -> None:
    """stdout is the soul compose_soul builds (plus a newline); stderr lists what was found."""
    home = fleet_root / "ava"
    result = invoke("soul", str(home))
    assert result.exit_code == 0, result.output
    soul, found = compose_soul(home)
    assert result.stdout == soul + "\n"
    assert result.stderr.startswith("found: " + ", ".join(found))


def test_soul_json_has_soul_and_found(invoke: Invoke, fleet_root: Path) -> None:
    """--json prints {"soul": ..., "found": [...]} and nothing else on stdout."""
    result = invoke("soul", str(fleet_root / "milo"), "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    soul, found = compose_soul(fleet_root / "milo")
    assert payload == {"soul": soul, "found": found}


def test_soul_honours_the_memory_index_cap_from_persona_toml(
    invoke: Invoke, tmp_path: Path
) -> None:
    """memory_index_cap in persona.toml applies to the preview, as it does to a turn."""
    home = tmp_path / "capped"
    home.mkdir()
    (home / "MEMORY.md").write_text("".join(f"- fact {i}\n" for i in range(50)), encoding="utf-8")
    (home / "persona.toml").write_text(
        "memory_index_cap = { max_lines = 3, max_bytes = 1000 }\n", encoding="utf-8"
    )
    payload = json.loads(invoke("soul", str(home), "--json").stdout)
    assert payload["soul"] == compose_soul(home, memory_index_cap=(3, 1000))[0]
    assert "- fact 3" not in payload["soul"]


def test_soul_accepts_a_persona_name_under_the_root(invoke: Invoke, fleet_root: Path) -> None:
    """A bare name that is not a directory here resolves under SOULFLEET_PERSONAS."""
    result = invoke("soul", "nora", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["soul"] == compose_soul(fleet_root / "nora")[0]


def test_soul_unknown_persona_is_one_line_exit_2(invoke: Invoke) -> None:
    """A name that is neither a directory nor a persona fails with one line and exit 2."""
    result = invoke("soul", "nobody")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("soulfleet: error: unknown persona 'nobody'")


def test_soul_invalid_persona_toml_names_the_key(invoke: Invoke, fleet_root: Path) -> None:
    """A bad persona.toml fails with exit 2 and a one-line error naming the key."""
    home = fleet_root / "ava"
    (home / "persona.toml").write_text('[heartbeat]\nevrey = "30m"\n', encoding="utf-8")
    result = invoke("soul", str(home))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "heartbeat.evrey" in result.stderr
    assert "Traceback" not in result.output


def test_a_directory_with_no_bootstrap_file_is_a_warning(invoke: Invoke, tmp_path: Path) -> None:
    """`soulfleet soul /etc` printed an empty soul with no word that the directory is no
    persona yet: the empty-soul warning `post` gives, on stderr; stdout stays the (empty) soul."""
    result = invoke("soul", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "has none of the bootstrap files" in result.stderr
    assert "soulfleet init DIR" in result.stderr
    assert result.stdout == "\n"
    as_json = invoke("soul", str(tmp_path), "--json")
    assert "has none of the bootstrap files" in as_json.stderr
    assert as_json.stdout.strip() == '{"soul": "", "found": []}'


def test_a_soul_over_the_turn_budget_is_a_warning_naming_the_setting(
    invoke: Invoke, fleet_root: Path
) -> None:
    """A soul whose estimate is over SOULFLEET_TURN_MAX_TOKENS can never reach its model: the
    preview says so on stderr (the soul still goes to stdout); under the budget, no warning."""
    home = fleet_root / "ava"
    (home / "MEMORY.md").write_text("- a remembered fact, written again and again\n" * 400)
    over = invoke("soul", str(home), environ={"SOULFLEET_TURN_MAX_TOKENS": "1000"})
    assert over.exit_code == 0, over.output
    assert "over the turn budget (SOULFLEET_TURN_MAX_TOKENS=1000)" in over.stderr
    assert "a remembered fact" in over.stdout
    assert "over the turn budget" not in invoke("soul", str(home)).stderr


def test_soul_refuses_what_a_turn_would_fail_with(invoke: Invoke, fleet_root: Path) -> None:
    """A scripted rules file that does not exist passed `soul` (exit 0) while `post` refused
    it and the turn would dead-letter: `soul` refuses it too, exit 2, naming the file."""
    home = fleet_root / "ava"
    (home / "persona.toml").write_text('model = "scripted:nope.toml"\n', encoding="utf-8")
    result = invoke("soul", str(home))
    assert result.exit_code == 2, result.output
    assert "nope.toml" in result.stderr
    assert result.stdout == ""


def test_soul_of_a_bare_name_is_the_fleets_persona_and_says_when_a_local_one_differs(
    invoke: Invoke, fleet_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`soul ava` with a directory ./ava here showed the local one, while `run`, `status` and
    `session` use the fleet's ava: it shows the fleet's now and says the local one differs
    (`./ava` previews that)."""
    here = tmp_path / "here"
    (here / "ava").mkdir(parents=True)
    (here / "ava" / "SOUL.md").write_text("the local impostor\n")
    monkeypatch.chdir(here)
    result = invoke("soul", "ava")
    assert result.exit_code == 0, result.output
    assert "the local impostor" not in result.stdout
    assert (fleet_root / "ava" / "SOUL.md").read_text().strip().splitlines()[0] in result.stdout
    assert "pass ./ava to preview that one" in result.stderr
    local = invoke("soul", "./ava")
    assert "the local impostor" in local.stdout
    assert "note:" not in local.stderr

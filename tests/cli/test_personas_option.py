"""`--personas` on fleet commands: honoured where the command touches that directory, refused
(exit 2, saying what to do) where the workers would read another root and the work would only
dead-letter as UnknownPersona."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from tests.cli.conftest import Invoke
from tests.support.cli import copy_demo, lanes_for, sync_registry

SENDING = (("post", "nora", "hi"), ("run", "nora", "hi"), ("dream", "nora"), ("revive", "nora"))


def test_another_root_is_refused_on_commands_that_send_work(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path, tmp_path: Path
) -> None:
    """beat recorded the root its fleet serves; post/run/dream/revive --personas OTHER exit 2
    naming that root and the ways out, and nothing reaches nora's lanes."""
    sync_registry(env)
    other = copy_demo(tmp_path / "other")
    for args in SENDING:
        result = invoke(args[0], "--personas", str(other), *args[1:])
        assert result.exit_code == 2, (args, result.output)
        assert f"the fleet's workers read personas from {fleet_root.resolve()}" in result.stderr
        assert "soulfleet up --personas" in result.stderr
    lanes = lanes_for(env)
    for lane in ("nora", "nora-dreamer"):
        assert lanes.status(lane)["inbox_depth"] == 0
        assert lanes.status(lane)["state"] == "idle"


def test_the_fleets_own_root_is_honoured(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """--personas naming the root the fleet serves is accepted and the post is delivered."""
    sync_registry(env)
    result = invoke("post", "--personas", str(fleet_root), "nora", "hi", "--no-wake")
    assert result.exit_code == 0, result.output
    assert lanes_for(env).status("nora")["inbox_depth"] == 1


def test_an_unknown_fleet_root_is_refused(invoke: Invoke, fleet_root: Path) -> None:
    """Before beat ever synced, nobody knows which root the workers read: refused with why."""
    result = invoke("post", "--personas", str(fleet_root), "nora", "hi")
    assert result.exit_code == 2, result.output
    assert "has not recorded which personas root" in result.stderr


def test_beats_refuses_and_status_honours_personas(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """beats --personas has nothing to apply to (exit 2); status --personas DIR lists DIR's."""
    refused = invoke("beats", "--personas", str(tmp_path))
    assert refused.exit_code == 2
    assert "drop --personas" in refused.stderr
    assert "--personas" not in invoke("beats", "--help").stdout  # not offered, only refused
    other = tmp_path / "other"
    (other / "zed").mkdir(parents=True)
    payload = json.loads(invoke("status", "--json", "--personas", str(other)).stdout)
    assert [entry["persona"] for entry in payload["personas"]] == ["zed"]


def test_status_of_another_root_warns_that_its_lane_state_is_the_fleets_personas(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path, tmp_path: Path
) -> None:
    """status --personas OTHER lists OTHER's nora with the fleet's nora's lane state (lanes are
    named by persona): a warning on stderr names both roots, stdout stays clean JSON; the
    fleet's own root gets no warning."""
    sync_registry(env)
    other = copy_demo(tmp_path / "other")
    result = invoke("status", "--json", "--personas", str(other))
    assert result.exit_code == 0, result.output
    assert f"serve personas from {fleet_root.resolve()}, not {other.resolve()}" in result.stderr
    assert json.loads(result.stdout)["personas"]
    one = invoke("status", "nora", "--personas", str(other))
    assert "same-named persona there" in one.stderr
    assert "warning" not in invoke("status", "--personas", str(fleet_root)).stderr


def test_a_soulfleet_personas_other_than_the_fleets_is_refused_on_commands_that_send_work(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """Without --personas, the command's own SOULFLEET_PERSONAS gets the same guard: a shell
    whose variable points elsewhere than the fleet's workers is refused (exit 2) with the root
    to use, and nothing is queued (it used to dead-letter the lane as UnknownPersona)."""
    sync_registry(env)
    other = copy_demo(tmp_path / "other")
    for args in SENDING:
        result = invoke(*args, environ={**env, "SOULFLEET_PERSONAS": str(other)})
        assert result.exit_code == 2, (args, result.output)
        assert "(SOULFLEET_PERSONAS)" in result.stderr
        assert "fleet's workers read them from" in result.stderr
    lanes = lanes_for(env)
    for lane in ("nora", "nora-dreamer"):
        assert lanes.status(lane)["inbox_depth"] == 0
        assert lanes.status(lane)["state"] == "idle"


def test_soul_and_tools_read_a_persona_of_the_root_personas_names(
    invoke: Invoke, tmp_path: Path
) -> None:
    """The README says a PERSONA name is looked up under SOULFLEET_PERSONAS or --personas, and
    `soul` suggested --personas in its own error, but `soul` and `tools` had no such option
    ("No such option", exit 2): they read the name under that root."""
    other = tmp_path / "other"
    (other / "zed").mkdir(parents=True)
    (other / "zed" / "SOUL.md").write_text("I am zed of the other root.\n", encoding="utf-8")
    shown = invoke("soul", "zed", "--personas", str(other))
    assert shown.exit_code == 0, shown.output
    assert "I am zed of the other root." in shown.stdout
    listed = invoke("tools", "zed", "--personas", str(other), "--json")
    assert listed.exit_code == 0, listed.output
    assert "memory" in [tool["name"] for tool in json.loads(listed.stdout)["tools"]]

"""Errors at the door: bad settings and invalid persona files are refused by the command that
would have queued work, with the reason; nothing is queued, and `status` tells the truth."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import (
    commit_turn,
    dead_letter,
    lanes_for,
    run_soulfleet,
    sync_registry,
)
from tests.support.cli import subprocess_env as full_env
from workers.fleet.lanes import Lanes
from workers.persona.python_tools import STALE_IMPORT

BAD_SETTINGS = [
    ("SOULFLEET_MODEL", "foo:bar"),
    ("SOULFLEET_LEASE_TTL", "soon"),
]


def _processes(tmp_path: Path) -> list[list[str]]:
    celery = [sys.executable, "-m", "celery", "-A", "workers"]
    return [
        [*celery, "worker", "--pool", "solo"],
        [*celery, "beat"],
        ["up", "--data", str(tmp_path / "data")],
        ["post", "nora", "hi"],
        ["soul", "ava"],
    ]


@pytest.mark.integration
@pytest.mark.parametrize(("variable", "value"), BAD_SETTINGS)
def test_every_process_refuses_a_bad_setting_naming_it(
    tmp_path: Path, env: Mapping[str, str | None], variable: str, value: str
) -> None:
    """worker, beat, up and CLI commands exit 2 at start with one line naming the variable (no
    traceback); `up` starts nothing (no Redis, no state file)."""
    import subprocess  # noqa: PLC0415 - only this test runs raw celery processes

    bad = {**env, variable: value}
    for argv in _processes(tmp_path):
        if argv[0] == sys.executable:
            result = subprocess.run(
                argv, env=full_env(bad), capture_output=True, text=True, timeout=60,
                check=False, cwd=str(tmp_path),
            )  # fmt: skip
        else:
            result = run_soulfleet(*argv, env=bad, timeout=60)
        assert result.returncode == 2, (argv, result.stdout, result.stderr)
        assert variable in result.stderr, (argv, result.stderr)
        assert "Traceback" not in result.stderr, (argv, result.stderr)
    assert not (tmp_path / "data" / "up.json").exists()
    assert not (tmp_path / "data" / "redis").exists()


def _table_names(stdout: str) -> list[str]:
    """The PERSONA column of status's table (the lines above the lists and summary below it)."""
    lines = stdout.splitlines()
    if not lines or not lines[0].startswith("PERSONA"):
        return []
    ends = ("lanes:", "invalid personas", "shared-mode lock claims")
    end = next(i for i, line in enumerate(lines) if line.startswith(ends))
    return [line.split()[0] for line in lines[1:end]]


def _break(persona: Path, text: str) -> None:
    (persona / "persona.toml").write_text(text, encoding="utf-8")


def _untouched(lanes: Lanes, lane: str) -> None:
    status = lanes.status(lane)
    assert status["state"] == "idle", status
    assert status["inbox_depth"] == 0, status
    assert status["pending_ticks"] == 0, status


def test_post_run_dream_to_an_invalid_persona_exit_2_and_queue_nothing(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A typo in persona.toml: post, run and dream exit 2 naming the file and key, and the key
    it was surely meant to be; neither the persona's lane nor its dreamer's holds anything
    afterwards."""
    _break(fleet_root / "nora", 'modle = "openai:x"\n')
    for args in (("post", "nora", "hi"), ("run", "nora", "hi"), ("dream", "nora")):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "'modle' is not a known key (did you mean 'model'?" in result.stderr, result.stderr
        assert str(fleet_root / "nora" / "persona.toml") in result.stderr
    lanes = lanes_for(env)
    _untouched(lanes, "nora")
    _untouched(lanes, "nora-dreamer")


def test_a_model_spec_naming_no_model_is_refused_at_post(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """persona.toml `model = "foo:bar"`: post exits 2 listing the accepted forms; nothing queued."""
    _break(fleet_root / "milo", 'model = "foo:bar"\n')
    result = invoke("post", "milo", "hi")
    assert result.exit_code == 2, result.output
    assert "openai:<model>" in result.stderr
    _untouched(lanes_for(env), "milo")


def test_a_use_of_an_mcp_server_the_fleet_lacks_is_refused_at_post_and_fixed_since_after(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """`[[tools.mcp]] use = "time"` with no SOULFLEET_MCP_CONFIG: post exits 2 naming the key
    (it was accepted and the lane dead-lettered at its turn); once the use is gone, a lane that
    died of it is listed as fixed since, with the revive advice."""
    _break(fleet_root / "milo", '[[tools.mcp]]\nname = "clock"\nuse = "time"\n')
    result = invoke("post", "milo", "hi")
    assert result.exit_code == 2, result.output
    assert "tools.mcp[0].use" in result.stderr
    assert "SOULFLEET_MCP_CONFIG is not set" in result.stderr
    lanes = lanes_for(env)
    _untouched(lanes, "milo")
    dead_letter(lanes, "milo", error=f"PersonaConfigError: {result.stderr.split('error: ')[-1]}")
    assert "fixed since" not in invoke("status").stdout
    _break(fleet_root / "milo", "")
    fixed = invoke("status")
    assert "fixed since: 1 dead-lettered lane(s)" in fixed.stdout, fixed.stdout
    assert "(milo)" in fixed.stdout


def test_run_local_rejects_a_cron_that_can_never_fire(invoke: Invoke, fleet_root: Path) -> None:
    """The one cron parser: `run --local` refuses `0 0 30 2 *` (Feb 30) naming dream.cron, as
    beat does, instead of running the persona."""
    _break(fleet_root / "ava", '[dream]\ncron = "0 0 30 2 *"\n')
    result = invoke("run", "ava", "hello", "--local")
    assert result.exit_code == 2, result.output
    assert "dream.cron" in result.stderr
    assert "never" in result.stderr


def test_an_empty_persona_directory_is_a_warning(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A persona directory with no bootstrap file runs, but post and run --local warn that its
    soul is empty (on stderr: stdout stays clean for scripts)."""
    (fleet_root / "blank").mkdir()
    posted = invoke("post", "blank", "hi", "--no-wake")
    assert posted.exit_code == 0, posted.output
    assert "warning: persona blank has none of the bootstrap files" in posted.stderr
    assert "warning" not in posted.stdout
    local = invoke("run", "blank", "hello", "--local")
    assert local.exit_code == 0, local.output
    assert "empty soul" in local.stderr


def test_a_persona_model_that_needs_a_missing_key_is_a_warning_at_the_door(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """persona.toml names an Anthropic model and no ANTHROPIC_API_KEY is set here: post still
    queues (the workers may have the key) but warns, naming the variable."""
    (fleet_root / "ava" / "persona.toml").write_text('model = "anthropic:claude-x"\n')
    posted = invoke("post", "ava", "hi", "--no-wake", environ={**env, "ANTHROPIC_API_KEY": ""})
    assert posted.exit_code == 0, posted.output
    assert "needs ANTHROPIC_API_KEY, which is not set here" in posted.stderr
    keyed = invoke("post", "ava", "hi", "--no-wake", environ={**env, "ANTHROPIC_API_KEY": "k"})
    assert keyed.exit_code == 0, keyed.output
    assert "ANTHROPIC_API_KEY" not in keyed.stderr


def test_status_shows_invalid_personas_with_beats_reason(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """After beat's registry sync recorded nora invalid, status shows her `invalid` with the
    reason, in the table, the count line and --json."""
    _break(fleet_root / "nora", "[heartbeat]\nevery = 5\n")
    sync_registry(env)
    table = invoke("status")
    assert table.exit_code == 0, table.output
    row = next(line for line in table.stdout.splitlines() if line.startswith("nora"))
    assert row.split()[1] == "invalid"
    assert "heartbeat.every" in row
    assert "invalid personas (1, not scheduled until fixed):" in table.stdout
    payload = json.loads(invoke("status", "--json").stdout)
    nora = next(p for p in payload["personas"] if p["persona"] == "nora")
    assert "heartbeat.every" in nora["invalid"]
    assert list(payload["invalid"]) == ["nora"]
    only = invoke("status", "--state", "invalid")
    assert _table_names(only.stdout) == ["nora"]


def test_status_says_when_a_fix_made_dead_lanes_runnable(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A lane dead-lettered by a configuration error whose persona now loads: status says it is
    fixed since and how to revive; a lane dead for another reason gets no such hint."""
    lanes = lanes_for(env)
    dead_letter(lanes, "milo", error="HTTPError: provider answered 500")
    assert "fixed since" not in invoke("status").stdout
    dead_letter(lanes, "nora", error="PersonaConfigError: persona.toml: key 'x' is not known")
    result = invoke("status")
    assert "fixed since: 1 dead-lettered lane(s)" in result.stdout
    assert "(nora)" in result.stdout
    assert "soulfleet revive --all" in result.stdout
    assert json.loads(invoke("status", "--json").stdout)["fixed_since_dead"] == ["nora"]


def test_a_tools_error_is_never_called_fixed_and_a_dreamer_gets_its_revive_flag(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """An MCP tool sharing a name shows only when the server runs, which the check-up does not
    do: such a lane is never said to be fixed (two Python tools sharing one, it sees). A lane
    dead-lettered for an allow-list naming a tool the server lacks (an error no more: the tool
    is left out) is. A fixed dreamer lane's
    hint names --dreamer (revive PERSONA alone revives the persona's own lane)."""
    lanes = lanes_for(env)
    dead_letter(lanes, "milo", error="PersonaConfigError: persona.toml: key 'tools.mcp[0]' gives "
                "a tool named 'time__now', and so does tools.mcp[1]")  # fmt: skip
    assert "fixed since" not in invoke("status").stdout
    # Two Python tools sharing one: the check-up sees that, so a fixed persona is fixed.
    dead_letter(lanes, "nora", error="PersonaConfigError: persona.toml: key 'tools.python[1]' "
                "gives a tool named 'add', and so does tools.python[0]: a model calls")  # fmt: skip
    assert "(nora)" in invoke("status").stdout
    lanes.revive("nora")
    dead_letter(lanes, "ava", error="PersonaConfigError: persona.toml: key 'tools.mcp[0].allow' "
                "names get_time_nope, which server time does not have")  # fmt: skip
    assert "(ava)" in invoke("status").stdout
    lanes.revive("ava")
    dead_letter(lanes, "nora-dreamer", error="PersonaFileError: SOUL.md: is a directory")
    result = invoke("status")
    assert "(nora-dreamer)" in result.stdout
    assert "soulfleet revive PERSONA [--dreamer]" in result.stdout


def test_status_state_filter_and_a_revived_lane_clears_its_error(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """--state dead keeps only dead personas; once the revived lane commits a turn, its row is
    idle with no LAST ERROR."""
    lanes = lanes_for(env)
    dead_letter(lanes, "milo", error="boom at night")
    dead = invoke("status", "--state", "dead")
    assert _table_names(dead.stdout) == ["milo"], dead.stdout
    assert "boom at night" in dead.stdout
    revived = lanes.revive("milo")
    assert revived.turn_id is not None
    started = lanes.start("milo", revived.turn_id, "test-worker")
    lanes.finish("milo", started.fence, status="done", text="fine again")
    row = next(line for line in invoke("status").stdout.splitlines() if line.startswith("milo"))
    assert "boom at night" not in row
    assert row.split()[1] == "idle"
    assert row.rstrip().endswith("-")
    assert "no personas in state dead" in invoke("status", "--state", "dead").stdout
    commit_turn(lanes, "ava", "ok")


def test_status_of_one_persona_refuses_a_state_filter(invoke: Invoke) -> None:
    """`status NAME --state S` is a usage error naming both ways out (it printed NAME's rows
    whatever their state, as if they matched)."""
    result = invoke("status", "zed", "--state", "dead")
    assert result.exit_code == 2
    assert "--state filters the listing of every persona" in result.stderr
    assert "zed" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("post", "milo", "hi \udcff"),
        ("post", "milo", "hi", "--from", "x\udcff"),
        ("run", "ava", "hi \udcff"),
        ("init", "{root}/zoe\udcff"),
    ],
)
def test_an_argument_that_is_not_utf8_is_refused_at_the_door(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path, args: tuple[str, ...]
) -> None:
    """A byte that is not UTF-8 in any argument (the shell hands it over; Python keeps it as a
    lone surrogate) is one line naming the argument and the byte, exit 2, before the command
    runs: it was a UnicodeEncodeError traceback from deep in the command, and `init` left a
    half-made persona behind. Nothing is queued, nothing is created."""
    before = sorted(path.name for path in fleet_root.iterdir())
    result = invoke(*(arg.replace("{root}", str(fleet_root)) for arg in args))
    assert result.exit_code == 2, result.output
    assert "is not UTF-8 text (byte 0xff)" in result.stderr
    assert "Traceback" not in result.output
    assert sorted(path.name for path in fleet_root.iterdir()) == before
    assert lanes_for(env).status("milo")["state"] == "idle"


def test_a_default_model_this_shell_cannot_reach_is_a_warning_for_commands_that_only_queue(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """SOULFLEET_MODEL names an Anthropic model and this shell has no ANTHROPIC_API_KEY (the
    workers do): `status` and `post` warn and go on; they refused with exit 2, although they
    never call the model. `run --local`, which calls it here, still refuses naming the key."""
    shell = {**env, "SOULFLEET_MODEL": "anthropic:claude-x", "ANTHROPIC_API_KEY": ""}
    status = invoke("status", environ=shell)
    assert status.exit_code == 0, status.output
    assert "warning: ANTHROPIC_API_KEY" in status.stderr
    posted = invoke("post", "ava", "hi", "--no-wake", environ=shell)
    assert posted.exit_code == 0, posted.output
    local = invoke("run", "--local", str(fleet_root / "ava"), "hi", environ=shell)
    assert local.exit_code == 2, local.output
    assert "ANTHROPIC_API_KEY" in local.stderr
    # One refusal, not a warning that "the workers" need the key before it.
    assert "warning" not in local.stderr, local.stderr
    assert local.stderr.count("ANTHROPIC_API_KEY") == 1, local.stderr
    # A persona with a model of its own never calls the default: run --local runs it.
    _break(fleet_root / "ava", 'model = "scripted:builtin"\n')
    own = invoke("run", "--local", str(fleet_root / "ava"), "hi", environ=shell)
    assert own.exit_code == 0, own.output
    assert "echo you: hi" in own.stdout


def test_run_local_refuses_a_persona_model_whose_key_is_not_set_here(
    invoke: Invoke, fleet_root: Path, env: Mapping[str, str | None]
) -> None:
    """persona.toml names an Anthropic model and this shell has no key: `run --local` calls the
    model itself, so it exits 2 naming the key (it warned that the workers need it, ran, and
    failed with ModelAuthError, exit 1); `--model` over it runs."""
    _break(fleet_root / "ava", 'model = "anthropic:claude-x"\n')
    shell = {**env, "ANTHROPIC_API_KEY": ""}
    local = invoke("run", "--local", "ava", "hi", environ=shell)
    assert local.exit_code == 2, local.output
    assert "needs ANTHROPIC_API_KEY, which is not set" in local.stderr
    assert "workers that run its turns" not in local.stderr
    scripted = invoke("run", "--local", "ava", "hi", "--model", "scripted:builtin", environ=shell)
    assert scripted.exit_code == 0, scripted.output


@pytest.mark.parametrize(
    "args", [("post", "milo", ""), ("post", "milo", "  \n"), ("run", "milo", "")]
)
def test_an_empty_message_is_refused(
    invoke: Invoke, env: Mapping[str, str | None], args: tuple[str, ...]
) -> None:
    """`post milo ""` queued an empty item and woke the persona for nothing: exit 2, nothing
    queued."""
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "is empty" in result.stderr
    assert lanes_for(env).status("milo")["state"] == "idle"


def test_status_state_invalid_also_lists_an_invalid_persona_whose_lane_is_dead(
    invoke: Invoke, env: Mapping[str, str | None], fleet_root: Path
) -> None:
    """A persona whose broken files killed its lane (a post accepted before the file broke,
    or a `use` only the workers' SOULFLEET_MCP_CONFIG decides) is dead AND invalid: the
    `invalid personas` footer lists it, so `status --state invalid` must list it too, not say
    "no personas in state invalid" right above that footer."""
    dead_letter(lanes_for(env), "nora", error="persona.toml: key 'heartbeat.every' is bad")
    _break(fleet_root / "nora", "[heartbeat]\nevery = 5\n")
    sync_registry(env)
    assert "invalid personas (1, not scheduled until fixed):" in invoke("status").stdout
    only = invoke("status", "--state", "invalid")
    assert only.exit_code == 0, only.output
    assert _table_names(only.stdout) == ["nora"]
    assert "no personas in state invalid" not in only.stdout


def test_a_worker_holding_an_older_tool_module_is_never_called_fixed_and_revive_warns(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A lane died on a tool ref missing from a module edited after the worker imported it:
    this shell imports the module fresh, so the check passed, status called the lane fixed
    and revive took it back, and it died again at once. Only restarting the workers fixes it:
    status does not call it fixed, and revive warns."""
    lanes = lanes_for(env)
    error = (
        "PersonaEditing: PersonaConfigError: persona.toml: key 'tools.python[0].ref' 'mod' has "
        "no attribute 'newtool' (this process imported /x/mod.py before it was last changed, "
        f"12:00:00: {STALE_IMPORT}, so restart the workers to load the edit)"
    )
    dead_letter(lanes, "nora", error=error)
    assert "fixed since" not in invoke("status").stdout
    revived = invoke("revive", "nora")
    assert revived.exit_code == 0, revived.output
    assert "a worker held an older import of a tool module" in revived.stderr
    assert "restart them first" in revived.stderr

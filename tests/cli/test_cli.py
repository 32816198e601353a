"""The `soulfleet` group: the pinned commands, documented exit codes, one-line failures."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import PASSWORD
from workers.cli.up import other_shells
from workers.local.datadir import default_data_dir
from workers.settings import Settings

PINNED = ("up", "init", "soul", "run", "post", "status", "beats", "dream")


def test_help_lists_every_pinned_command_and_the_exit_codes(invoke: Invoke) -> None:
    """--help names all eight commands and documents exit statuses 0, 1 and 2."""
    result = invoke("--help")
    assert result.exit_code == 0
    listed = result.stdout.split("Commands:")[1]
    for command in PINNED:
        assert f"\n  {command} " in listed, command
    assert "0 ok, 1 runtime failure" in result.stdout
    assert "2 usage or bad input" in result.stdout


def test_unknown_option_is_a_usage_error(invoke: Invoke) -> None:
    """click's own usage errors exit 2."""
    assert invoke("status", "--bogus").exit_code == 2


@pytest.mark.parametrize(
    "args",
    [("post", "ava", "hi"), ("status",), ("beats",), ("dream", "ava"), ("run", "ava", "hi"),
     ("run", "ava", "hi", "--local"), ("up", "--personas", "."), ("soul", "ava"), ("usage",)],
)  # fmt: skip
def test_invalid_settings_name_the_variable(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Every command that reads settings fails with exit 2 and one line naming the variable."""
    environ = {**env, "SOULFLEET_LEASE_TTL": "soon"}
    extra = ("--data", str(tmp_path / "data")) if args[0] == "up" else ()
    result = invoke(*args, *extra, environ=environ)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("soulfleet: error: SOULFLEET_LEASE_TTL")


def test_up_refusing_a_setting_copies_no_demo_personas(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """`up` without --personas on a new data folder copies the demo personas, and the start
    that copies them is the one that posts nora her welcome. A bad setting is refused before
    that: the folder holds no personas after it (they were copied, so the next, real first
    start posted no welcome)."""
    data = tmp_path / "data"
    environ = {**env, "SOULFLEET_PERSONAS": None, "SOULFLEET_MODEL": "anthropic:claude-x",
               "ANTHROPIC_API_KEY": None}  # fmt: skip
    result = invoke("up", "--data", str(data), environ=environ)
    assert result.exit_code == 2, result.output
    assert "ANTHROPIC_API_KEY" in result.stderr
    assert not (data / "personas").exists()


def test_up_with_an_unreachable_redis_fails_before_starting_anything(
    invoke: Invoke, dead_redis_env: Mapping[str, str | None], fleet_root: Path, tmp_path: Path
) -> None:
    """`up` pointed at a dead REDIS_URL exits 1 naming it without password; no state is left.
    On a Redis of the user's own its banner tells other shells what they need besides it
    (prefixes, personas, and a data dir other than the default: through it they check a
    persona's tools with what this `up` gave its workers)."""
    data = tmp_path / "data"
    result = invoke("up", "--data", str(data), "--personas", str(fleet_root),
                    environ=dead_redis_env)  # fmt: skip
    assert result.exit_code == 1
    assert f"SOULFLEET_DATA={data}" in result.output
    needed = f"SOULFLEET_KEY_PREFIX={dead_redis_env['SOULFLEET_KEY_PREFIX']}"
    hidden = 'REDIS_URL="<the URL given to this up; not printed: it holds a password>"'
    assert f"other shells: {hidden} {needed}" in result.output
    assert PASSWORD not in result.output
    assert "soulfleet: error: Redis at redis://:***@127.0.0.1:" in result.stderr
    assert not (data / "up.json").exists()
    assert not (data / "logs" / "worker-1.log").exists()


def test_up_with_a_missing_personas_root_is_bad_input(invoke: Invoke, tmp_path: Path) -> None:
    """`up --personas` naming no directory exits 2 before starting Redis or any child."""
    data = tmp_path / "data"
    result = invoke("up", "--data", str(data), "--personas", str(tmp_path / "typo"))
    assert result.exit_code == 2
    assert "typo" in result.stderr
    assert result.stderr.count("\n") == 1
    assert not (data / "redis").exists() or not any((data / "redis").iterdir())


def test_other_shells_are_told_what_they_need_to_find_this_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedded Redis: nothing on the default data dir, SOULFLEET_DATA on another. A Redis of
    the user's own: REDIS_URL (as it is when it holds no password, so the line can be pasted;
    else a placeholder), the prefixes that differ from the defaults, the personas root, a data
    dir other than the default, the MCP config and the PYTHONPATH its workers were given,
    shell-quoted."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SOULFLEET_DATA", raising=False)
    default = default_data_dir().expanduser().resolve()
    personas = tmp_path / "my personas"
    embedded = Settings.from_env({})
    assert other_shells(embedded, default, personas) is None
    assert other_shells(embedded, tmp_path / "d", personas) == f"SOULFLEET_DATA={tmp_path}/d"
    own = Settings.from_env({"REDIS_URL": f"redis://:{PASSWORD}@db:6379/0"})
    hidden = 'REDIS_URL="<the URL given to this up; not printed: it holds a password>"'
    assert other_shells(own, default, personas) == f"{hidden} SOULFLEET_PERSONAS='{personas}'"
    open_url = Settings.from_env({"REDIS_URL": "redis://db:6379/15"})
    assert other_shells(open_url, default, personas) == (
        f"REDIS_URL=redis://db:6379/15 SOULFLEET_PERSONAS='{personas}'"
    )
    url = f"redis://:{PASSWORD}@db:6379/0"
    prefixes = {"SOULFLEET_KEY_PREFIX": "t2:", "SOULFLEET_QUEUE_PREFIX": "t2"}
    prefixed = Settings.from_env({"REDIS_URL": url, **prefixes})
    needed = other_shells(prefixed, tmp_path / "d", personas)
    assert needed == (
        f"{hidden} SOULFLEET_KEY_PREFIX=t2: SOULFLEET_QUEUE_PREFIX=t2 "
        f"SOULFLEET_PERSONAS='{personas}' SOULFLEET_DATA={tmp_path}/d"
    )
    # What the workers check a persona's tools with: a shell left without them would check
    # against its own (and accept what the workers then fail on, or refuse what they run).
    mcp = tmp_path / "mcp.json"
    mcp.write_text('{"mcpServers": {}}', encoding="utf-8")
    tooled = Settings.from_env({"REDIS_URL": "redis://db:6379/15",
                                "SOULFLEET_MCP_CONFIG": str(mcp)})  # fmt: skip
    assert other_shells(tooled, default, personas, ("/opt/tools", "/srv/lib")) == (
        f"REDIS_URL=redis://db:6379/15 SOULFLEET_PERSONAS='{personas}' "
        f"SOULFLEET_MCP_CONFIG={mcp} PYTHONPATH=/opt/tools:/srv/lib"
    )

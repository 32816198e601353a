"""The CLI finds its fleet or says there is none: it never guesses 127.0.0.1:6379.

A decoy redis-server stands where the old default pointed (its address injected as the would-be
default, so the machine's own Redis on 6379 is never touched): with no REDIS_URL and no `up`
running, every fleet command exits 2 with "no fleet is running" and the decoy never sees a
single connection.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.cli import (
    closed_port_url,
    dead_letter,
    lanes_for,
    run_soulfleet,
    subprocess_env,
    sync_registry,
)
from workers.cli.context import NO_FLEET
from workers.local.datadir import DataDir, UpState
from workers.local.redis_server import RedisServer

FLEET_COMMANDS = [
    ("post", "nora", "hi"),
    ("run", "nora", "hi", "--timeout", "3"),
    ("status",),
    ("status", "nora"),
    ("beats",),
    ("dream", "nora"),
    ("revive", "nora"),
]

# The console script, with the settings' default address replaced by the decoy's.
_WITH_DEFAULT = (
    "import sys, workers.settings as s; s.DEFAULT_REDIS_URL = sys.argv.pop(1); "
    "from workers.cli import main; sys.argv[0] = 'soulfleet'; main()"
)


@pytest.fixture
def decoy(tmp_path: Path) -> Iterator[tuple[str, redis.Redis]]:
    """A real redis-server on a free port, and one open connection to watch it with."""
    with RedisServer(tmp_path / "decoy") as server:
        client = redis.Redis.from_url(server.url)
        client.info("stats")
        try:
            yield server.url, client
        finally:
            client.close()


def _connections(client: redis.Redis) -> int:
    return int(client.info("stats")["total_connections_received"])


def _no_fleet_env(tmp_path: Path, personas: Path) -> dict[str, str | None]:
    env: dict[str, str | None] = {
        name: None
        for name in os.environ
        if name.startswith(("SOULFLEET_", "CELERY_", "OPENAI_", "ANTHROPIC_"))
    }
    env.update(
        {
            "REDIS_URL": None,
            "XDG_DATA_HOME": str(tmp_path / "xdg"),
            "SOULFLEET_PERSONAS": str(personas),
        }
    )
    return env


def _up(data: DataDir, fleet_root: Path, redis_url: str, **fields: Any) -> UpState:
    """A live `up`'s record (this test process's pid) on ``data`` serving ``fleet_root``
    through ``redis_url`` (embedded unless ``fields`` say otherwise)."""
    record: dict[str, Any] = {
        "pid": os.getpid(), "redis_url": redis_url, "personas": str(fleet_root),
        "key_prefix": "k:", "queue_prefix": "q", "data": str(data.root), "started_at": 1.0,
        "embedded_redis": True, **fields,
    }  # fmt: skip
    return UpState(**record)


def _soulfleet(
    default: str, env: Mapping[str, str | None], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITH_DEFAULT, default, *args],
        env=subprocess_env(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.integration
def test_no_fleet_commands_exit_2_and_never_touch_the_would_be_default(
    tmp_path: Path, fleet_root: Path, decoy: tuple[str, redis.Redis]
) -> None:
    """post, run, status, beats, dream and revive with no REDIS_URL and no `up`: exit 2 with
    the no-fleet message, nothing printed on stdout, zero connections to the decoy, no keys."""
    url, client = decoy
    before = _connections(client)
    env = _no_fleet_env(tmp_path, fleet_root)
    for args in FLEET_COMMANDS:
        result = _soulfleet(url, env, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert NO_FLEET in result.stderr, (args, result.stderr)
        assert result.stdout == "", (args, result.stdout)
        assert "no surfaced beats" not in result.stderr
    assert _connections(client) == before
    assert client.dbsize() == 0


@pytest.mark.integration
def test_an_up_on_its_own_redis_is_named_instead_of_guessed(
    tmp_path: Path, fleet_root: Path, decoy: tuple[str, redis.Redis]
) -> None:
    """A running `up` that uses the user's own REDIS_URL (recorded without its password): the
    CLI says to set REDIS_URL to it, exits 2, and still connects nowhere."""
    url, client = decoy
    before = _connections(client)
    data = DataDir(tmp_path / "xdg" / "soulfleet")
    data.write_state(_up(data, fleet_root, "redis://:***@10.9.8.7:6390/0", embedded_redis=False))
    result = _soulfleet(url, _no_fleet_env(tmp_path, fleet_root), "post", "nora", "hi")
    assert result.returncode == 2, result.stderr
    assert "set REDIS_URL to the same URL" in result.stderr
    assert "redis://:***@10.9.8.7:6390/0" in result.stderr
    assert _connections(client) == before


@pytest.mark.integration
def test_local_commands_need_no_fleet(tmp_path: Path, fleet_root: Path) -> None:
    """`run --local` and `soul` work with no fleet at all (they never need Redis)."""
    env = _no_fleet_env(tmp_path, fleet_root)
    result = _soulfleet("redis://127.0.0.1:1/0", env, "run", "ava", "hello", "--local")
    assert result.returncode == 0, result.stderr
    assert _soulfleet("redis://127.0.0.1:1/0", env, "soul", "ava").returncode == 0


@pytest.mark.integration
def test_an_up_on_another_data_dir_is_found_through_soulfleet_data(
    tmp_path: Path, fleet_root: Path, decoy: tuple[str, redis.Redis]
) -> None:
    """An `up --data DIR` (embedded Redis, here the decoy) is not found from the default data
    dir: the error says to set SOULFLEET_DATA=DIR; with it set, the command reaches that Redis."""
    url, client = decoy
    data = DataDir(tmp_path / "elsewhere")
    data.write_state(_up(data, fleet_root, url))
    env = _no_fleet_env(tmp_path, fleet_root)
    before = _connections(client)
    missed = _soulfleet("redis://127.0.0.1:1/0", env, "status")
    assert missed.returncode == 2, missed.stderr
    assert "set SOULFLEET_DATA=DIR" in missed.stderr
    assert _connections(client) == before
    found = _soulfleet("redis://127.0.0.1:1/0", {**env, "SOULFLEET_DATA": str(data.root)}, "status")
    assert found.returncode == 0, found.stderr
    assert _connections(client) > before


@pytest.mark.integration
def test_an_unknown_persona_with_no_fleet_says_both(tmp_path: Path, fleet_root: Path) -> None:
    """With no fleet found, a persona missing from the default root is not the whole story: the
    error says first that no fleet (whose root it would be) was found, then names the persona."""
    result = _soulfleet("redis://127.0.0.1:1/0", _no_fleet_env(tmp_path, fleet_root), "post",
                        "ghost", "hi")  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "unknown persona 'ghost'" in result.stderr
    assert NO_FLEET in result.stderr
    assert result.stderr.index(NO_FLEET) < result.stderr.index("unknown persona")


def test_with_redis_url_and_no_personas_root_the_fleets_recorded_root_is_used(
    env: Mapping[str, str | None], fleet_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` tells another shell to set REDIS_URL; with only that set (no SOULFLEET_PERSONAS,
    no --personas), commands read the personas root beat recorded for the fleet's workers.
    They read ./personas instead: `status` hid the fleet's personas and `post` refused them."""
    sync_registry(env)  # beat's sync records the workers' root in Redis
    bare = {**env, "SOULFLEET_PERSONAS": None}
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "personas" / "stranger").mkdir(parents=True)
    (elsewhere / "personas" / "stranger" / "SOUL.md").write_text("You are a stranger.\n")
    monkeypatch.chdir(elsewhere)
    status = run_soulfleet("status", "--json", env=bare)
    assert status.returncode == 0, status.stderr
    listed = {row["persona"] for row in json.loads(status.stdout)["personas"]}
    assert listed == {"ava", "milo", "nora"}
    post = run_soulfleet("post", "nora", "hi", env=bare)
    assert post.returncode == 0, post.stderr
    assert lanes_for(env).status("nora")["state"] == "queued"


def _persona_with_python_tool(tools: Path, fleet_root: Path, module: str) -> None:
    """``abacus`` under ``fleet_root``, with a Python tool from ``module`` in ``tools``."""
    tools.mkdir()
    (tools / f"{module}.py").write_text(
        "from workers.persona import FunctionTool, ToolResult\n"
        "adder = FunctionTool('add', 'Add.', {'type': 'object'}, lambda a: ToolResult('3'))\n"
    )
    (fleet_root / "abacus").mkdir()
    (fleet_root / "abacus" / "SOUL.md").write_text("You add.\n", encoding="utf-8")
    (fleet_root / "abacus" / "persona.toml").write_text(
        f'[[tools.python]]\nref = "{module}:adder"\n'
    )


@pytest.mark.integration
def test_a_python_tool_is_imported_with_the_pythonpath_of_the_running_up(
    tmp_path: Path, fleet_root: Path, decoy: tuple[str, redis.Redis]
) -> None:
    """The README gives PYTHONPATH to `up`; a shell without it posting to a persona with a
    Python tool found there is accepted (it was refused: the door imported the tool with this
    shell's path only), and so is a revive of its dead lane. With an empty PYTHONPATH recorded,
    the refusal says the workers cannot import it either."""
    url, client = decoy
    tools = tmp_path / "tools"
    _persona_with_python_tool(tools, fleet_root, "walk_tools_15")
    data = DataDir(tmp_path / "xdg" / "soulfleet")
    state = _up(data, fleet_root, url, mcp_config="", python_path=())
    data.write_state(state)
    env = {**_no_fleet_env(tmp_path, fleet_root), "PYTHONPATH": None}
    refused = _soulfleet("redis://127.0.0.1:1/0", env, "post", "abacus", "1+2")
    assert refused.returncode == 2, refused.stderr
    assert "cannot import module 'walk_tools_15'" in refused.stderr
    assert "the running up gave its workers no PYTHONPATH" in refused.stderr
    assert client.dbsize() == 0
    # revive checks the persona through the fleet's own door: with the workers' path too.
    lanes = lanes_for({**env, "REDIS_URL": url, "SOULFLEET_KEY_PREFIX": "k:"})
    dead_letter(lanes, "abacus")
    not_revived = _soulfleet("redis://127.0.0.1:1/0", env, "revive", "abacus")
    assert not_revived.returncode == 2, not_revived.stderr
    assert "the running up gave its workers no PYTHONPATH" in not_revived.stderr
    data.write_state(replace(state, python_path=(str(tools),)))
    revived = _soulfleet("redis://127.0.0.1:1/0", env, "revive", "abacus")
    assert revived.returncode == 0, revived.stderr
    assert lanes.status("abacus")["state"] == "queued"
    accepted = _soulfleet("redis://127.0.0.1:1/0", env, "post", "abacus", "1+2")
    assert accepted.returncode == 0, accepted.stderr
    assert lanes.status("abacus")["inbox_depth"] == 1


@pytest.mark.integration
def test_run_local_and_soul_import_a_python_tool_as_the_running_ups_workers_do(
    tmp_path: Path, fleet_root: Path, decoy: tuple[str, redis.Redis]
) -> None:
    """`run --local` (and `soul`, also of a copy outside the root) in a shell without the
    PYTHONPATH the README gives `up` failed (exit 2,
    "cannot import module", no hint) while `tools` and `post` found the tool through the
    running `up`'s path: it imports as they do now, and with an empty path recorded says
    the workers cannot import it either."""
    url, _ = decoy
    tools = tmp_path / "tools"
    _persona_with_python_tool(tools, fleet_root, "walk_tools_17")
    data = DataDir(tmp_path / "xdg" / "soulfleet")
    state = _up(data, fleet_root, url, mcp_config="", python_path=(str(tools),))
    data.write_state(state)
    env = {**_no_fleet_env(tmp_path, fleet_root), "PYTHONPATH": None}
    ran = _soulfleet("redis://127.0.0.1:1/0", env, "run", "abacus", "hello", "--local")
    assert ran.returncode == 0, ran.stderr
    soul = _soulfleet("redis://127.0.0.1:1/0", env, "soul", "abacus")  # `soul` alike
    assert soul.returncode == 0, soul.stderr
    data.write_state(replace(state, python_path=()))
    refused = _soulfleet("redis://127.0.0.1:1/0", env, "run", "abacus", "hello", "--local")
    assert refused.returncode == 2, refused.stderr
    assert "the running up gave its workers no PYTHONPATH" in refused.stderr
    # a persona outside the fleet's root, which no worker runs, keeps this shell's path
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(fleet_root / "abacus", elsewhere / "abacus")
    mine = {**env, "PYTHONPATH": str(tools)}
    ran = _soulfleet("redis://127.0.0.1:1/0", mine, "run", str(elsewhere / "abacus"), "hi",
                     "--local")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    # `soul` of a copy staged outside the root (the runbook's check of an edit before it is
    # moved in) checks it as the workers will see it then: their PYTHONPATH, not this shell's
    # (it refused a valid persona whose tools only the workers' path finds).
    data.write_state(state)
    staged = _soulfleet("redis://127.0.0.1:1/0", env, "soul", str(elsewhere / "abacus"))
    assert staged.returncode == 0, staged.stderr


@pytest.mark.integration
def test_a_python_tool_only_this_shell_can_import_is_refused_as_the_workers_would(
    tmp_path: Path, fleet_root: Path, decoy: tuple[str, redis.Redis]
) -> None:
    """This shell's PYTHONPATH finds the tool; the running `up` recorded that its workers have
    none. `post`, `tools` and `revive` all refuse (exit 2, saying the workers cannot import
    it), where they passed the check with this shell's path and the lane then dead-lettered
    on the workers (and status called the error fixed)."""
    url, client = decoy
    tools = tmp_path / "pylib"
    _persona_with_python_tool(tools, fleet_root, "walk_tools_16")
    data = DataDir(tmp_path / "xdg" / "soulfleet")
    data.write_state(_up(data, fleet_root, url, mcp_config="", python_path=()))
    env = {**_no_fleet_env(tmp_path, fleet_root), "PYTHONPATH": str(tools)}
    for argv in (("post", "abacus", "1+2"), ("tools", "abacus")):
        refused = _soulfleet("redis://127.0.0.1:1/0", env, *argv)
        assert refused.returncode == 2, (argv, refused.stdout, refused.stderr)
        assert "cannot import module 'walk_tools_16'" in refused.stderr
        assert "the running up gave its workers no PYTHONPATH" in refused.stderr
    assert client.dbsize() == 0
    lanes = lanes_for({**env, "REDIS_URL": url, "SOULFLEET_KEY_PREFIX": "k:"})
    dead_letter(lanes, "abacus")
    not_revived = _soulfleet("redis://127.0.0.1:1/0", env, "revive", "abacus")
    assert not_revived.returncode == 2, not_revived.stderr
    assert lanes.status("abacus")["state"] == "dead"


@pytest.mark.integration
def test_a_use_is_checked_against_the_mcp_config_of_the_running_up(
    tmp_path: Path, fleet_root: Path, decoy: tuple[str, redis.Redis]
) -> None:
    """A shell with SOULFLEET_MCP_CONFIG posting to an `up` started without it: exit 2 naming
    the `up` and what to restart it with, nothing queued (it was accepted, and the persona's
    lane dead-lettered at its first turn). Once `up` records the same file, the post goes in;
    an `up` that recorded nothing (an older one) is taken to have this shell's."""
    url, client = decoy
    mcp = tmp_path / "mcp.json"
    mcp.write_text('{"mcpServers": {"time": {"command": "mcp-server-time"}}}', encoding="utf-8")
    (fleet_root / "tim").mkdir()
    (fleet_root / "tim" / "SOUL.md").write_text("You are Tim.\n", encoding="utf-8")
    (fleet_root / "tim" / "persona.toml").write_text('[[tools.mcp]]\nuse = "time"\n')
    data = DataDir(tmp_path / "xdg" / "soulfleet")
    state = _up(data, fleet_root, url, mcp_config="")
    data.write_state(state)
    env = {**_no_fleet_env(tmp_path, fleet_root), "SOULFLEET_MCP_CONFIG": str(mcp)}
    refused = _soulfleet("redis://127.0.0.1:1/0", env, "post", "tim", "hi")
    assert refused.returncode == 2, refused.stderr
    assert "key 'tools.mcp[0].use' names no server" in refused.stderr
    assert "was started without SOULFLEET_MCP_CONFIG" in refused.stderr
    assert f"restart it with SOULFLEET_MCP_CONFIG={mcp.resolve()}" in refused.stderr
    assert client.dbsize() == 0
    data.write_state(replace(state, mcp_config=str(mcp.resolve())))
    accepted = _soulfleet("redis://127.0.0.1:1/0", env, "post", "tim", "hi")
    assert accepted.returncode == 0, accepted.stderr
    assert client.dbsize() > 0
    # An up.json from before the file was recorded: unknown, so this shell's is taken.
    data.write_state(replace(state, mcp_config=None))
    older = _soulfleet("redis://127.0.0.1:1/0", env, "post", "tim", "again")
    assert older.returncode == 0, older.stderr
    # A shell WITHOUT the variable, posting to an `up` that has it (the README's way): the
    # fleet's door checks against the up's file too (it checked this shell's, and refused).
    data.write_state(replace(state, mcp_config=str(mcp.resolve())))
    bare = {**env, "SOULFLEET_MCP_CONFIG": None}
    for argv in (("post", "tim", "from a bare shell"), ("tools", "tim", "--json")):
        done = _soulfleet("redis://127.0.0.1:1/0", bare, *argv)
        assert done.returncode == 0, (argv, done.stderr)
    assert json.loads(done.stdout)["tools"][0]["server"] == "time"


@pytest.mark.integration
def test_a_shell_on_the_same_redis_as_an_up_of_its_own_redis_checks_with_that_ups_tools(
    tmp_path: Path, fleet_root: Path, decoy: tuple[str, redis.Redis]
) -> None:
    """An `up` on a Redis of the user's own, started with SOULFLEET_MCP_CONFIG; a shell with
    the same REDIS_URL and prefix (as up's "other shells" line says) but no MCP config: a post
    to a persona using that config's server goes in (it was refused: "SOULFLEET_MCP_CONFIG is
    not set"). A shell on another prefix is another fleet: not adopted, refused as before."""
    url, client = decoy
    mcp = tmp_path / "mcp.json"
    mcp.write_text('{"mcpServers": {"time": {"command": "mcp-server-time"}}}', encoding="utf-8")
    (fleet_root / "tim").mkdir()
    (fleet_root / "tim" / "SOUL.md").write_text("You are Tim.\n", encoding="utf-8")
    (fleet_root / "tim" / "persona.toml").write_text('[[tools.mcp]]\nuse = "time"\n')
    data = DataDir(tmp_path / "xdg" / "soulfleet")
    data.write_state(
        _up(
            data,
            fleet_root,
            url,
            embedded_redis=False,
            mcp_config=str(mcp.resolve()),
            python_path=(),
        )
    )
    env = {**_no_fleet_env(tmp_path, fleet_root), "REDIS_URL": url,
           "SOULFLEET_KEY_PREFIX": "k:", "SOULFLEET_QUEUE_PREFIX": "q"}  # fmt: skip
    accepted = _soulfleet("redis://127.0.0.1:1/0", env, "post", "tim", "hi")
    assert accepted.returncode == 0, accepted.stderr
    assert lanes_for(env).status("tim")["inbox_depth"] == 1
    other = {**env, "SOULFLEET_KEY_PREFIX": "other:"}
    refused = _soulfleet("redis://127.0.0.1:1/0", other, "post", "tim", "hi")
    assert refused.returncode == 2, refused.stderr
    assert "SOULFLEET_MCP_CONFIG is not set" in refused.stderr
    assert client.dbsize() > 0


@pytest.mark.integration
def test_an_up_whose_redis_does_not_answer_is_not_called_stopped_while_it_runs(
    tmp_path: Path, fleet_root: Path
) -> None:
    """A command whose found `up` had its Redis paused past the 30 s socket timeout said the
    `up` "has stopped; start it again", while it ran (a second `up` would be refused): with
    the `up`'s pid alive it says its Redis did not answer and to try again."""
    silent = socket.create_server(("127.0.0.1", 0))  # connects, never answers: a paused Redis
    port = silent.getsockname()[1]
    data = DataDir(tmp_path / "xdg" / "soulfleet")
    state = _up(
        data,
        fleet_root,
        f"redis://127.0.0.1:{port}/0?socket_timeout=1",
        mcp_config="",
        python_path=(),
    )
    data.write_state(state)
    env = _no_fleet_env(tmp_path, fleet_root)
    try:
        alive = _soulfleet("redis://127.0.0.1:1/0", env, "usage")
    finally:
        silent.close()
    assert alive.returncode == 1, alive.stderr
    assert f"(data {data.root}, pid {os.getpid()}) is running, but its Redis" in alive.stderr
    assert "it has stopped" not in alive.stderr
    # a Redis that refuses the connection (its process gone) is still "stopped"
    data.write_state(replace(state, redis_url=closed_port_url()))
    gone = _soulfleet("redis://127.0.0.1:1/0", env, "usage")
    assert "no longer answers at" in gone.stderr
    assert "it has stopped; start it again" in gone.stderr

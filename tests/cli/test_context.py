"""Which fleet a command reaches: REDIS_URL, else a live `up`'s state file, else the default."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import closed_port_url
from workers.cli.context import CliContext, fleet_environ, persona_dir
from workers.fleet.errors import UnknownPersona
from workers.local.datadir import DataDir, UpState


def _state(tmp: Path, pid: int, *, embedded: bool = True) -> UpState:
    return UpState(
        pid=pid,
        redis_url="redis://127.0.0.1:41234/0",
        personas=str(tmp / "up-personas"),
        key_prefix="upfleet:",
        queue_prefix="upfleet",
        data=str(tmp / "xdg" / "soulfleet"),
        started_at=1.0,
        embedded_redis=embedded,
    )


def _write(tmp: Path, state: UpState) -> dict[str, str]:
    DataDir(tmp / "xdg" / "soulfleet").write_state(state)
    return {"XDG_DATA_HOME": str(tmp / "xdg"), "HOME": str(tmp)}


def test_a_running_up_is_adopted_when_redis_url_is_unset(tmp_path: Path) -> None:
    """No REDIS_URL + a live up.json: its Redis, prefixes and personas root are used."""
    environ = _write(tmp_path, _state(tmp_path, os.getpid()))
    env, adopted = fleet_environ(None, environ)
    assert adopted is not None
    assert adopted.pid == os.getpid()
    assert env["REDIS_URL"] == "redis://127.0.0.1:41234/0"
    assert env["SOULFLEET_KEY_PREFIX"] == "upfleet:"
    assert env["SOULFLEET_QUEUE_PREFIX"] == "upfleet"
    assert env["SOULFLEET_PERSONAS"] == str(tmp_path / "up-personas")


def test_explicit_settings_win_over_the_state_file(tmp_path: Path) -> None:
    """REDIS_URL set: the state file is ignored; --personas beats the up's root."""
    environ = _write(tmp_path, _state(tmp_path, os.getpid()))
    env, adopted = fleet_environ(None, {**environ, "REDIS_URL": "redis://10.0.0.1:6379/0"})
    assert adopted is None
    assert env["REDIS_URL"] == "redis://10.0.0.1:6379/0"
    assert "SOULFLEET_KEY_PREFIX" not in env
    env, adopted = fleet_environ(tmp_path / "mine", {**environ, "SOULFLEET_KEY_PREFIX": "x:"})
    assert adopted is not None
    assert env["SOULFLEET_PERSONAS"] == str(tmp_path / "mine")
    assert env["SOULFLEET_KEY_PREFIX"] == "x:"


def test_a_dead_up_or_an_external_redis_is_not_adopted(tmp_path: Path) -> None:
    """A state file whose pid is gone, or that records a user's own Redis, is ignored."""
    dead = 2**22 + 12345  # above Linux's default pid_max: no such process
    environ = _write(tmp_path, _state(tmp_path, dead))
    assert fleet_environ(None, environ)[1] is None
    environ = _write(tmp_path, _state(tmp_path, os.getpid(), embedded=False))
    env, adopted = fleet_environ(None, environ)
    assert adopted is None
    assert "REDIS_URL" not in env


def test_persona_dir_prefers_the_root_for_bare_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare name resolves under the root even if the working directory has one too."""
    root = tmp_path / "root"
    (root / "ava").mkdir(parents=True)
    (tmp_path / "ava").mkdir()
    (tmp_path / "solo").mkdir()
    monkeypatch.chdir(tmp_path)
    assert persona_dir("ava", root) == root / "ava"
    assert persona_dir("./ava", root) == Path("./ava")
    assert persona_dir("solo", root) == Path("solo")
    with pytest.raises(UnknownPersona):
        persona_dir("ghost", root)


def test_persona_dir_finds_a_home_under_the_root_whose_name_the_fleet_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --local zoë`, `soul zoë`, `tools zoë`: these take any persona home, and one under
    the root named so the fleet skips it is found there (they said "no directory 'zoë'" of a
    directory that is there); a name with no directory still names none."""
    root = tmp_path / "root"
    for name in ("zoë", "my persona"):
        (root / name).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert persona_dir("zoë", root) == root / "zoë"
    assert persona_dir("my persona", root) == root / "my persona"
    assert persona_dir("zoe\u0308", root) == root / "zoë"  # typed decomposed
    with pytest.raises(UnknownPersona):
        persona_dir("zoe", root)


def test_a_command_whose_adopted_up_stopped_answering_says_so(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """No REDIS_URL, a live up.json whose Redis no longer answers (here a closed port): the
    error names that `up` and says to start it again, not to check a REDIS_URL never set."""
    state = _state(tmp_path, os.getpid())
    closed = closed_port_url()
    environ = _write(tmp_path, dataclasses.replace(state, redis_url=closed))
    shell = {k: v for k, v in env.items() if k not in ("REDIS_URL", "SOULFLEET_KEY_PREFIX")}
    result = invoke("status", environ={**shell, **environ, "REDIS_URL": None})
    assert result.exit_code == 1, result.output
    assert "the `soulfleet up` this command found" in result.stderr
    assert "no longer answers" in result.stderr
    assert "REDIS_URL" not in result.stderr


def test_the_workers_import_path_replaces_this_shells_but_keeps_site_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `up` recorded its workers' PYTHONPATH (none here). This shell's PYTHONPATH names a
    tools directory of its own, which goes (the workers cannot import from it), and its
    virtualenv's site-packages, which stays: it would be on the path without PYTHONPATH, and
    taking it out broke every later import of this process (mcp, anthropic, psutil)."""
    import site  # noqa: PLC0415 - only this test needs it

    site_packages = site.getsitepackages()[0]
    tools = tmp_path / "pylib"
    tools.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tools), site_packages]))
    monkeypatch.setattr(sys, "path", [*sys.path, str(tools)])
    context = CliContext()
    context.adopted = dataclasses.replace(_state(tmp_path, os.getpid()), python_path=())
    assert context.import_as_workers() == ()
    assert str(tools) not in sys.path
    assert site_packages in sys.path
    theirs = tmp_path / "theirs"
    context.adopted = dataclasses.replace(context.adopted, python_path=(str(theirs),))
    assert context.import_as_workers() == (str(theirs),)
    assert sys.path[1] == str(theirs)

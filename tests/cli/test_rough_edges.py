"""Rough edges of the CLI, each as a user meets it: a pipe that closes early, a `run` with no
worker, JSON from every command that prints, colours only on a terminal."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import (
    commit_turn,
    dead_letter,
    lanes_for,
    run_soulfleet,
    settings_for,
    soulfleet_argv,
    subprocess_env,
)
from tests.support.fleet import fleet_env, start_worker
from workers.local.redis_server import free_port
from workers.publisher import CeleryPublisher


@pytest.mark.integration
def test_beats_json_piped_into_head_exits_0_quietly(
    env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """`soulfleet beats --json -n 400 | head -1` under pipefail: exit 0, one line, nothing on
    stderr (400 beats of 2 KB overflow the pipe, so the write after head left does fail)."""
    lanes = lanes_for(env)
    for i in range(400):
        commit_turn(lanes, "ava", f"beat {i} " + "x" * 2000)
    command = " ".join(shlex.quote(part) for part in soulfleet_argv("beats", "--json", "-n", "400"))
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{command} | head -1"],
        env=subprocess_env(env), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout)["persona"] == "ava"


@pytest.mark.integration
def test_run_with_no_worker_says_so_within_seconds(env: Mapping[str, str | None]) -> None:
    """No worker consumes the interactive queue: `run` says so on stderr after a few seconds
    (not after its whole timeout), then times out with exit 1; the item stays queued, and the
    turn is handed to the reaper's next pass (queued_at 0): a running fleet on this Redis with
    another queue prefix (a shell's typo) sends it to its own workers instead of leaving the
    persona blocked for SOULFLEET_REAP_QUEUED_AFTER. (A beat sweeps under its key prefix: a
    fleet runs there; without one it says no fleet does, next test.)"""
    lanes = lanes_for(env)
    lanes.client.set(lanes.keys.last_sweep, json.dumps({"at": time.time() + 60}))
    result = run_soulfleet("run", "ava", "hello?", "--timeout", "10", env=env, timeout=90)
    assert result.returncode == 1, result.stderr
    assert "no worker is consuming" in result.stderr
    assert ".interactive" in result.stderr
    assert "the same REDIS_URL, SOULFLEET_KEY_PREFIX" in result.stderr  # a shell's typo
    assert f"SOULFLEET_QUEUE_PREFIX (here {env['SOULFLEET_QUEUE_PREFIX']!r})" in result.stderr
    assert "handed to that fleet's reaper" in result.stderr
    status = lanes_for(env).status("ava")
    assert status["state"] == "queued"
    assert status["queued_at"] == 0.0


def _run_with_no_worker(env: Mapping[str, str | None]) -> subprocess.CompletedProcess[str]:
    """`run ava` with a 3 s timeout and no worker: it gives up (exit 1) saying none consumes."""
    result = run_soulfleet("run", "ava", "hello?", "--timeout", "3", env=env, timeout=90)
    assert result.returncode == 1, result.stderr
    assert "no worker is consuming" in result.stderr
    return result


@pytest.mark.integration
def test_a_run_with_a_short_timeout_still_hears_that_no_worker_consumes(
    env: Mapping[str, str | None],
) -> None:
    """--timeout 3, shorter than the usual wait before asking: the question is asked at half
    the timeout, so the run that gives up says why, not only "no answer within 3s"; with no
    beat under its key prefix it says that too, at once."""
    result = _run_with_no_worker(env)
    # No beat under this prefix either: said at once, as `post` says it, and no fleet's
    # reaper is promised to send the turn.
    assert "no beat has ever swept under key prefix" in result.stderr
    assert "no fleet runs on it yet" in result.stderr
    assert "handed to that fleet's reaper" not in result.stderr


@pytest.mark.integration
def test_a_run_where_beat_stopped_says_it_stopped_not_that_no_fleet_runs(
    env: Mapping[str, str | None],
) -> None:
    """A beat swept under this key prefix an hour ago and stopped: the run with no worker says
    beat stopped (and how long ago), and that its reaper sends the turn once beat runs again,
    not that no fleet runs here, and not that a reaper takes it now."""
    lanes = lanes_for(env)
    lanes.client.set(lanes.keys.last_sweep, json.dumps({"at": time.time() - 3600}))
    result = _run_with_no_worker(env)
    assert "beat has stopped sweeping under this key prefix (last sweep 360" in result.stderr
    assert "once beat runs again" in result.stderr
    assert "no fleet runs on it yet" not in result.stderr
    assert "handed to that fleet's reaper meanwhile" not in result.stderr


@pytest.mark.integration
def test_run_says_when_a_try_failed_instead_of_waiting_in_silence(
    env: Mapping[str, str | None], redis_url: str, key_prefix: str, fleet_root: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A worker runs the turn against a provider nobody listens on: the try fails and the fleet
    retries it, and `run` says so (with the error) within seconds, not only at its timeout."""
    model = {
        "SOULFLEET_MODEL": "openai:some-model",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
        "SOULFLEET_MODEL_RETRIES": "0",
    }
    worker_env = {
        **fleet_env(redis_url=redis_url, key_prefix=key_prefix, personas=fleet_root), **model,
    }  # fmt: skip
    worker = start_worker(worker_env, tmp_path / "logs", name="failing", queues=("interactive",))
    try:
        result = run_soulfleet(
            "run", "ava", "hello?", "--timeout", "12", env={**env, **model}, timeout=90
        )
    finally:
        worker.stop()
    assert result.returncode == 1, result.stderr
    assert "a try of this turn failed" in result.stderr
    assert "the fleet retries it" in result.stderr
    assert result.stderr.count("a try of this turn failed") == 1


@pytest.mark.integration
def test_consumers_names_the_workers_of_a_queue(
    env: Mapping[str, str | None], redis_url: str, key_prefix: str, fleet_root: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A real worker serving only the interactive queue is found for it and not for dream."""
    worker_env = fleet_env(redis_url=redis_url, key_prefix=key_prefix, personas=fleet_root)
    worker = start_worker(worker_env, tmp_path / "logs", name="edge", queues=("interactive",))
    publisher = CeleryPublisher(settings_for(env))
    try:
        found = publisher.consumers("interactive", timeout=3.0)
        assert len(found) == 1
        assert found[0].startswith("edge@")
        assert publisher.consumers("dream", timeout=3.0) == []
    finally:
        publisher.close()
        worker.stop()


def test_json_on_post_dream_revive_and_init(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """Every command that prints has --json: one JSON object on stdout."""
    posted = json.loads(invoke("post", "ava", "hi", "--no-wake", "--json").stdout)
    assert posted["persona"] == "ava"
    assert posted["depth"] == 1
    assert posted["outcome"] == "pending"
    dreamt = json.loads(invoke("dream", "nora", "--json").stdout)
    assert dreamt["lane"] == "nora-dreamer"
    assert dreamt["outcome"] == "queued"
    dead_letter(lanes_for(env), "milo")
    revived = json.loads(invoke("revive", "milo", "--json").stdout)
    assert revived == {"lane": "milo", "revived": True, "turn_id": revived["turn_id"],
                       "items_dropped": 0}  # fmt: skip
    assert revived["turn_id"]
    again = invoke("revive", "milo", "--json")
    assert again.exit_code == 1
    assert json.loads(again.stdout)["revived"] is False
    made = json.loads(invoke("init", str(tmp_path / "zoe"), "--json").stdout)
    assert made["persona"] == "zoe"
    assert "SOUL.md" in made["files"]


def test_colours_only_on_a_terminal(invoke: Invoke, env: Mapping[str, str | None]) -> None:
    """A dead lane's state is red on a terminal and plain text in a pipe or file."""
    dead_letter(lanes_for(env), "milo")
    piped = invoke("status")
    assert "\x1b[" not in piped.output
    assert "dead" in piped.stdout
    from click.testing import CliRunner  # noqa: PLC0415

    from workers.cli import cli  # noqa: PLC0415

    terminal = CliRunner().invoke(cli, ["status"], env=dict(env), color=True)
    assert "\x1b[31mdead" in terminal.stdout

"""ops/runbook.md names only things that exist: settings, Redis keys, CLI commands, host API.

A runbook is read at the worst moment; a variable that is not read, a key that is spelled
differently or a snippet that raises costs an operator the time they do not have. The Fleet
snippets are run for real against this suite's Redis, on a dead-lettered lane.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from tests.support.fleet import fleet_env
from tests.support.ops import ALERTS, COMPOSE, DOCKERFILE, REPO, RUNBOOK
from workers.app import make_app
from workers.cli import cli
from workers.fleet import Fleet
from workers.fleet.keys import Keys
from workers.publisher import connect
from workers.settings import Settings

SECTIONS = (
    "Stuck lane",
    "Dead-lettered lane",
    "Redis down or restarted",
    "Lock timeouts on a shared filesystem",
    "Scaling out",
    "Rotating a model key",
    "Running one or two beats",
)


def _runbook() -> str:
    return RUNBOOK.read_text(encoding="utf-8")


def test_runbook_has_the_sections_the_issue_names() -> None:
    """Each operations topic the issue lists is a second-level section."""
    headings = set(re.findall(r"^## (.+?)\s*$", _runbook(), re.M))
    assert set(SECTIONS) <= headings


def _settings_read_by_code() -> set[str]:
    names: set[str] = set()
    for package in ("workers", "beat"):
        for path in (REPO / package).rglob("*.py"):
            names |= set(re.findall(r"[\"'](SOULFLEET_[A-Z0-9_]+)[\"']", path.read_text("utf-8")))
    return names


def test_every_soulfleet_variable_in_the_ops_files_is_a_real_setting() -> None:
    """SOULFLEET_* names in the runbook, compose, Dockerfile and alerts are all read by code."""
    read = _settings_read_by_code()
    assert {"SOULFLEET_LOCK_MODE", "SOULFLEET_METRICS_PORT"} <= read
    for path in (RUNBOOK, COMPOSE, DOCKERFILE, ALERTS):
        named = set(re.findall(r"\bSOULFLEET_[A-Z0-9_]+", path.read_text(encoding="utf-8")))
        assert named - read == set(), path.name


def test_every_redis_key_in_the_runbook_is_one_the_code_builds() -> None:
    """`soulfleet:...` keys are Keys' fleet-wide keys, per-lane keys, or kombu's broker keys."""
    settings = Settings()
    keys = Keys(settings.key_prefix)
    fixed = {
        keys.queued,
        keys.running,
        keys.dead,
        keys.beats,
        keys.gate,
        keys.schedule,
        keys.schedule_spec,
        keys.registry,
        keys.last_sweep,
        keys.retry,
        keys.claimed,
        keys.breakers,
        keys.inbox_rejects,
    }
    per_lane = (
        keys.lane(""), keys.inbox(""), keys.inflight(""), keys.lease(""), keys.reply(""),
        keys.claim(""), keys.deferred(""), keys.breaker(""),
    )  # fmt: skip
    broker = str(make_app(settings).conf.broker_transport_options["global_keyprefix"])
    mentioned = set(re.findall(r"\bsoulfleet:[A-Za-z0-9_:.<>*-]*[A-Za-z0-9_>*]", _runbook()))
    assert mentioned
    wrong = {
        key
        for key in mentioned
        if key not in fixed
        and not any(key.startswith(prefix) and len(key) > len(prefix) for prefix in per_lane)
        and not key.startswith(f"{broker}{settings.queue_prefix}.")
        and key != keys.prefix
    }
    assert wrong == set()


def test_every_cli_command_in_the_runbook_exists() -> None:
    """`sf CMD` (the soulfleet CLI in a worker) uses only commands the CLI has."""
    used = set(re.findall(r"`sf (\w+)", _runbook()))
    assert used
    assert used - set(cli.commands) == set()


def _fleet_snippets() -> list[str]:
    """The runbook's Python that uses the host API: one-liners and the heredoc block."""
    text = _runbook()
    snippets = re.findall(r"python -c '([^']*connect\(\)[^']*)'", text)
    snippets += [
        textwrap.dedent(block)
        for block in re.findall(r"python - <<'EOF'\n(.*?)\n\s*EOF", text, re.S)
        if "connect()" in block
    ]
    return [snippet.replace('"NAME"', '"ava"') for snippet in snippets]


def _dead_letter(fleet: Fleet, lane: str) -> None:
    """Queue a turn (or take the queued one), start it and fail it: one attempt allowed."""
    fleet.lanes.tick(lane, kind="heartbeat")
    turn_id = fleet.lanes.status(lane)["turn_id"]
    assert isinstance(turn_id, str)
    started = fleet.lanes.start(lane, turn_id, "runbook-test")
    fleet.lanes.fail(lane, started.fence, error="runbook test failure")
    assert fleet.lanes.status(lane)["state"] == "dead"


@pytest.mark.integration
def test_the_runbook_fleet_snippets_run_and_revive_a_dead_lane(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Each Fleet snippet runs as written; revive takes a dead lane back to queued."""
    personas = tmp_path / "personas"
    (personas / "ava").mkdir(parents=True)
    env = fleet_env(
        redis_url=redis_url,
        key_prefix=key_prefix,
        personas=personas,
        extra={"SOULFLEET_MAX_ATTEMPTS": "1"},
    )
    fleet = connect(Settings.from_env(env))
    snippets = _fleet_snippets()
    assert any("revive" in s for s in snippets)
    assert any("reap" in s for s in snippets)
    for snippet in snippets:
        reviving = "revive" in snippet and "dreamer=True" not in snippet
        if reviving:
            _dead_letter(fleet, "ava")
        result = subprocess.run(
            [sys.executable, "-c", snippet],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"{snippet}\n{result.stderr}"
        if reviving:
            status = fleet.lanes.status("ava")
            assert status["state"] == "queued", snippet
            assert status["attempts"] == 0

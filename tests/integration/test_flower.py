"""Flower shows the truth: real worker, real Flower (basic auth, as the README opens it).

A persona whose files are invalid fails every turn. Each failed turn must be a FAILURE in
Flower carrying the error's type and message, each task must show whose turn it was and its
kind, and raising must not change delivery: every failed message is acknowledged (nothing is
left unacked for redelivery), so the number of FAILURE rows equals the number of failed turns
the worker logged.
"""

from __future__ import annotations

import base64
import json
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import post_past_the_door, settled, spawn, wait_until
from workers.local.redis_server import free_port

pytestmark = pytest.mark.integration

AUTH = "ops:flower-test-pw"


def _api(port: int, path: str, auth: str | None = AUTH) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth is not None:
        token = base64.b64encode(auth.encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _tasks(port: int) -> dict[str, dict[str, Any]]:
    try:
        tasks: dict[str, dict[str, Any]] = _api(port, "/api/tasks")
    except (urllib.error.URLError, ConnectionError, ValueError):
        return {}
    return tasks


def test_failed_turns_are_failures_in_flower_with_persona_kind_and_error(
    harness: Harness,
) -> None:
    """An invalid persona.toml: every turn of nora's lane is a FAILURE whose exception names
    TurnFailed, the lane and PersonaConfigError; its args/kwargs show nora and 'interactive';
    the broker holds no unacked or queued message once the lane is dead-lettered."""
    harness.configure(SOULFLEET_MAX_ATTEMPTS="3", SOULFLEET_TASK_EVENTS="1")
    settled(harness.persona("nora", toml='hartbeat = "typo"\n'))  # broken, not mid-edit
    harness.persona("ava")
    harness.worker()
    port = free_port()
    argv = [sys.executable, "-m", "celery", "-A", "workers", "flower",
            "--address=127.0.0.1", f"--port={port}", f"--basic-auth={AUTH}"]  # fmt: skip
    harness.processes.append(spawn("flower", argv, harness.env, harness.logs))
    wait_until(lambda: _reachable(port), timeout=60, what="Flower to answer")
    with pytest.raises(urllib.error.HTTPError) as refused:
        _api(port, "/api/tasks", auth=None)
    assert refused.value.code == 401

    # ava first, until Flower shows one of her turns: task events are pub/sub, so whatever a
    # worker sends before Flower's receiver has subscribed is gone. Once one arrived, it listens.
    def ava_seen() -> list[dict[str, Any]]:
        seen = [t for t in _tasks(port).values()
                if "'ava'" in str(t.get("args")) and t.get("state") == "SUCCESS"]  # fmt: skip
        if not seen:
            harness.fleet.post("ava", "hello", sender="test", channel="api")
        return seen

    ava = wait_until(ava_seen, timeout=90, interval=3.0, what="ava's turn in Flower")
    assert "interactive" in str(ava[0]["kwargs"])

    post_past_the_door(harness.fleet, "nora", "hello")  # Fleet.post refuses broken files
    wait_until(lambda: harness.fleet.lanes.status("nora")["state"] == "dead", timeout=90,
               what="nora's lane to be dead-lettered")  # fmt: skip
    # The lane is dead a moment before the worker logs that turn's end.
    wait_until(lambda: harness.events("turn.end", lane="nora", status="error", dead=True),
               timeout=30, what="the dead-lettering turn's end in the worker log")  # fmt: skip
    failed_turns = harness.events("turn.end", lane="nora", status="error")

    def rows() -> list[dict[str, Any]]:
        found = [t for t in _tasks(port).values() if "'nora'" in str(t.get("args"))]
        done = [t for t in found if t.get("state") in ("FAILURE", "SUCCESS")]
        return found if len(done) >= len(failed_turns) else []

    nora = wait_until(rows, timeout=90, what="Flower to record nora's turns")
    assert len(nora) == len(failed_turns), nora
    for task in nora:
        assert task["name"] == "soulfleet.turn"
        assert task["state"] == "FAILURE", task
        assert "TurnFailed" in task["exception"], task
        assert "nora: PersonaConfigError" in task["exception"], task
        assert "hartbeat" in task["exception"], task
        assert "interactive" in str(task["kwargs"]), task

    client = harness.fleet.client
    prefix = f"{harness.settings.key_prefix}broker:"
    assert client.hlen(f"{prefix}unacked") == 0
    for kind in ("interactive", "heartbeat", "dream"):
        assert client.llen(f"{prefix}{harness.settings.queue_prefix}.{kind}") == 0
    # Nothing was redelivered: one turn.start per failed turn, no more.
    assert len(harness.events("turn.start", lane="nora")) == len(failed_turns)


def _reachable(port: int) -> bool:
    try:
        _api(port, "/api/workers")
    except (urllib.error.URLError, ConnectionError, ValueError):
        return False
    return True

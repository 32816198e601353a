"""The commands and health checks the containers run, run here as real processes.

There is no Docker engine in CI, but everything inside the containers is ordinary Python: this
starts beat, a worker and Flower with the argv docker-compose.yml gives them, against this
suite's Redis, and runs the image's health checks against them. So the compose commands start,
the worker HEALTHCHECK pings the right node, beat's health follows its sweeps, Flower refuses
anonymous requests, and every series the alerts read from beat is really in beat's scrape.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fleet import FleetProcess, fleet_env, spawn, wait_until
from tests.support.ops import (
    COMPOSE,
    DOCKERFILE,
    OPS,
    alert_rules,
    dashboard_exprs,
    load_yaml,
)
from workers.local.redis_server import free_port

pytestmark = pytest.mark.integration

HEALTHCHECK = OPS / "healthcheck.py"
FLOWER_AUTH = "ops-test:flower-secret"


def _compose_argv(service: str) -> list[str]:
    """The service's command from docker-compose.yml, defaults of ${VAR:-x} applied."""
    command = str(load_yaml(COMPOSE)["services"][service]["command"])
    command = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", command)
    argv = shlex.split(command)
    assert argv[0] == "celery"
    return [sys.executable, "-m", "celery", *argv[1:]]


def _env(redis_url: str, key_prefix: str, personas: Path, **extra: str) -> dict[str, str]:
    env = fleet_env(redis_url=redis_url, key_prefix=key_prefix, personas=personas)
    # The queue names compose's -Q lists; the test's key prefix still isolates the broker keys.
    env["SOULFLEET_QUEUE_PREFIX"] = "soulfleet"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


@pytest.fixture
def personas(tmp_path: Path) -> Path:
    root = tmp_path / "personas"
    (root / "ava").mkdir(parents=True)
    (root / "ava" / "SOUL.md").write_text("You are Ava.\n")
    return root


def _healthcheck(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _scrape(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


def _beat_series() -> set[str]:
    """Series the alerts and the dashboard select with job="soulfleet-beat"."""
    found: set[str] = set()
    for expr in [*(str(rule["expr"]) for rule in alert_rules()), *dashboard_exprs()]:
        found |= set(re.findall(r'\b(soulfleet_\w+)\{[^}]*job="soulfleet-beat"', expr))
    return found


def test_beat_runs_as_compose_runs_it_and_its_healthcheck_follows_the_sweep(
    redis_url: str, key_prefix: str, personas: Path, tmp_path: Path, processes: list[FleetProcess]
) -> None:
    """compose's beat command sweeps; the health check passes; beat exports what alerts read."""
    port = free_port()
    env = _env(redis_url, key_prefix, personas, SOULFLEET_METRICS_PORT=str(port))
    beat = spawn("beat", _compose_argv("beat"), env, tmp_path / "logs")
    processes.append(beat)
    beat.wait_for_event("sweep.done", timeout=60)

    def healthy() -> bool:
        return _healthcheck("beat", "--max-age", "60", env=env).returncode == 0

    wait_until(healthy, timeout=30, what="beat health check")
    exported = _scrape(port)
    wanted = _beat_series()
    assert {"soulfleet_lanes", "soulfleet_last_sweep_timestamp_seconds"} <= wanted
    assert wanted - exported == set()

    beat.stop()
    stopped = _healthcheck("beat", "--timeout", "2", env=env)
    assert stopped.returncode == 1


def test_worker_runs_as_compose_runs_it_and_answers_the_image_healthcheck(
    redis_url: str, key_prefix: str, personas: Path, tmp_path: Path, processes: list[FleetProcess]
) -> None:
    """compose's worker command starts; the Dockerfile HEALTHCHECK pings this node, not another."""
    port = free_port()
    env = _env(
        redis_url,
        key_prefix,
        personas,
        SOULFLEET_METRICS_PORT=str(port),
        SOULFLEET_WORKER_CONCURRENCY="4",
        HOSTNAME=socket.gethostname(),
    )
    argv = _compose_argv("worker")
    argv[argv.index("-c") + 1] = "4"
    worker = spawn("worker", argv, env, tmp_path / "logs")
    processes.append(worker)
    worker.wait_for_event("worker.ready", timeout=60)

    healthcheck = _dockerfile_healthcheck()
    ok = subprocess.run(
        healthcheck, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    elsewhere = subprocess.run(
        [part.replace("--timeout 10", "--timeout 2") for part in healthcheck],
        env={**env, "HOSTNAME": "no-such-host"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert elsewhere.returncode != 0
    assert "soulfleet_lease_losses_total" in _scrape(port)


def _dockerfile_healthcheck() -> list[str]:
    """The argv of the Dockerfile's HEALTHCHECK (exec form: Docker runs it as written)."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("HEALTHCHECK"))
    argv = json.loads(line.split(" CMD ", 1)[1])
    assert isinstance(argv, list)
    return [str(part) for part in argv]


def _get(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_flower_refuses_anonymous_requests_and_its_healthcheck_passes(
    redis_url: str, key_prefix: str, personas: Path, tmp_path: Path, processes: list[FleetProcess]
) -> None:
    """Flower with FLOWER_BASIC_AUTH: 401 without credentials, 200 with; /healthcheck is open."""
    port = free_port()
    env = _env(redis_url, key_prefix, personas, FLOWER_BASIC_AUTH=FLOWER_AUTH)
    argv = [part for part in _compose_argv("flower") if not part.startswith("--port")]
    flower = spawn("flower", [*argv, f"--port={port}", "--address=127.0.0.1"], env, tmp_path)
    processes.append(flower)
    base = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        if flower.popen.poll() is not None:
            raise AssertionError(f"flower exited:\n{flower.tail()}")
        return _healthcheck("http", f"{base}/healthcheck", env=env).returncode == 0

    wait_until(answering, timeout=60, what="flower /healthcheck")
    assert _get(f"{base}/") == 401
    assert _get(f"{base}/", auth="ops-test:wrong") == 401
    assert _get(f"{base}/", auth=FLOWER_AUTH) == 200

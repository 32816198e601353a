"""docker-compose.yml: valid for the real ``docker-compose`` and true to the code it deploys.

``docker-compose config`` is the validator (on PATH, or fetched by tests/support/tools.py; no
Docker engine needed). The tests then read its resolved output, so what they check is what
compose would run: interpolated variables, merged anchors, profiles.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.ops import COMPOSE, PROMETHEUS, REPO, load_yaml
from tests.support.tools import ToolMissing, docker_compose
from workers.queues import KINDS, declare_queues, queue_name
from workers.settings import Settings

REDIS_PASSWORD = "test-redis-pw-0123456789abcdef"
FLOWER_AUTH = "ops-test:flower-pw-0123456789"
APP_SERVICES = ("worker", "dream-worker", "beat", "flower")


def _docker_compose() -> str:
    try:
        return docker_compose()
    except ToolMissing as exc:
        pytest.fail(str(exc))


def _run(args: list[str], env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run docker-compose on the repository's file with exactly ``env`` (plus PATH/HOME).

    An empty --env-file keeps a developer's local .env out of the result.
    """
    env_file = tmp / "empty.env"
    env_file.write_text("")
    full_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp), **env}
    return subprocess.run(
        [_docker_compose(), "--env-file", str(env_file), "-f", str(COMPOSE), *args],
        env=full_env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


REQUIRED_ENV = {"REDIS_PASSWORD": REDIS_PASSWORD, "FLOWER_BASIC_AUTH": FLOWER_AUTH}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The resolved compose model, every profile included."""
    tmp = tmp_path_factory.mktemp("compose")
    result = _run(["config"], REQUIRED_ENV, tmp)
    assert result.returncode == 0, result.stderr
    parsed = yaml.safe_load(result.stdout)
    assert isinstance(parsed, dict)
    return parsed


def _service(config: dict[str, Any], name: str) -> dict[str, Any]:
    service = config["services"][name]
    assert isinstance(service, dict)
    return service


def _command(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.integration
def test_config_quiet_accepts_the_file_with_the_required_secrets(tmp_path: Path) -> None:
    """`docker-compose config -q` exits 0 once REDIS_PASSWORD and FLOWER_BASIC_AUTH are set."""
    result = _run(["config", "-q"], REQUIRED_ENV, tmp_path)
    assert result.returncode == 0, result.stderr
    monitoring = _run(["--profile", "monitoring", "config", "-q"], REQUIRED_ENV, tmp_path)
    assert monitoring.returncode == 0, monitoring.stderr


@pytest.mark.parametrize("missing", sorted(REQUIRED_ENV))
def test_a_missing_secret_fails_loudly(tmp_path: Path, missing: str) -> None:
    """Without REDIS_PASSWORD or FLOWER_BASIC_AUTH compose refuses, naming the variable."""
    env = {name: value for name, value in REQUIRED_ENV.items() if name != missing}
    result = _run(["config", "-q"], env, tmp_path)
    assert result.returncode != 0
    assert missing in result.stderr


def test_no_secret_has_a_default_in_the_file() -> None:
    """Every ${VAR:-default} whose name looks secret defaults to empty (no baked-in secret)."""
    text = COMPOSE.read_text(encoding="utf-8")
    defaults = re.findall(r"\$\{([A-Z0-9_]+):-([^}]*)\}", text)
    secret = re.compile(r"PASSWORD|AUTH|KEY|SECRET|TOKEN")
    baked = {name: value for name, value in defaults if secret.search(name) and value}
    assert baked == {}
    assert defaults, "the pattern must see the file's ${VAR:-default} uses"


def test_redis_has_aof_noeviction_password_volume_and_healthcheck(config: dict[str, Any]) -> None:
    """Redis: appendonly yes, noeviction, requirepass from REDIS_PASSWORD, /data on a volume."""
    redis = _service(config, "redis")
    assert str(redis["image"]).startswith("redis:7")
    argv = _command(redis)
    assert _flag(argv, "--appendonly") == "yes"
    assert _flag(argv, "--maxmemory-policy") == "noeviction"
    assert _flag(argv, "--requirepass") == REDIS_PASSWORD
    assert any(str(v).startswith("redis-data:/data") for v in redis["volumes"])
    assert "healthcheck" in redis
    assert "ports" not in redis, "Redis must not be published on the host"


def test_every_app_service_gets_a_redis_url_with_the_password(config: dict[str, Any]) -> None:
    """worker, dream-worker, beat and flower reach redis:6379 with the password."""
    for name in APP_SERVICES:
        env = _service(config, name)["environment"]
        assert env["REDIS_URL"] == f"redis://:{REDIS_PASSWORD}@redis:6379/0", name
        assert env["SOULFLEET_METRICS_PORT"] == "9808", name


def test_every_app_service_environment_is_valid_for_the_settings(config: dict[str, Any]) -> None:
    """The environment compose gives each app container parses into Settings, as intended."""
    for name in APP_SERVICES:
        env = {key: str(value) for key, value in _service(config, name)["environment"].items()}
        settings = Settings.from_env(env)
        assert settings.metrics_port == 9808
        assert settings.personas == Path("/personas")
        assert settings.queue_prefix == "soulfleet"
        assert settings.log_format == "json"


def test_worker_serves_the_declared_queues_with_a_thread_pool(config: dict[str, Any]) -> None:
    """The worker runs `celery -A workers worker -P threads` on exactly the code's three queues."""
    argv = _command(_service(config, "worker"))
    assert argv[:4] == ["celery", "-A", "workers", "worker"]
    assert _flag(argv, "-P") == "threads"
    assert _flag(argv, "-c") == str(Settings().worker_concurrency)
    declared = {queue.name for queue in declare_queues(Settings().queue_prefix)}
    assert set(_flag(argv, "-Q").split(",")) == declared
    assert len(declared) == len(KINDS)


def test_dream_worker_serves_only_the_dream_queue_and_is_opt_in(config: dict[str, Any]) -> None:
    """dream-worker consumes only <prefix>.dream and runs only with its profile."""
    service = _service(config, "dream-worker")
    argv = _command(service)
    assert _flag(argv, "-Q") == queue_name(Settings().queue_prefix, "dream")
    assert service["profiles"] == ["dream-workers"]


def test_scalable_services_have_no_container_name_or_host_ports(config: dict[str, Any]) -> None:
    """worker, dream-worker and beat can run as N replicas (`--scale`)."""
    for name in ("worker", "dream-worker", "beat"):
        service = _service(config, name)
        assert "container_name" not in service, name
        assert "ports" not in service, name


def test_beat_runs_the_celery_beat_command(config: dict[str, Any]) -> None:
    """beat is `celery -A workers beat` (the app picks the fleet scheduler itself)."""
    assert _command(_service(config, "beat")) == ["celery", "-A", "workers", "beat"]


def test_flower_requires_basic_auth_from_the_environment(config: dict[str, Any]) -> None:
    """Flower gets FLOWER_BASIC_AUTH from the environment, never on its command line."""
    flower = _service(config, "flower")
    argv = _command(flower)
    assert argv[:4] == ["celery", "-A", "workers", "flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == FLOWER_AUTH
    assert not any("basic" in part for part in argv)
    published = [str(port) for port in flower["ports"]]
    assert published
    assert all(port.startswith("127.0.0.1:") for port in published)


def test_personas_volume_is_shared_at_the_personas_path(config: dict[str, Any]) -> None:
    """worker, dream-worker and beat mount the one `personas` volume at SOULFLEET_PERSONAS."""
    assert "personas" in config["volumes"]
    for name in ("worker", "dream-worker", "beat"):
        service = _service(config, name)
        target = service["environment"]["SOULFLEET_PERSONAS"]
        mounts = [str(volume).split(":") for volume in service["volumes"]]
        assert ["personas", target] in [mount[:2] for mount in mounts], name


def test_monitoring_services_are_opt_in_and_mount_ops_read_only(config: dict[str, Any]) -> None:
    """prometheus and grafana run only in the monitoring profile, fed read-only from ops/."""
    for name in ("prometheus", "grafana"):
        service = _service(config, name)
        assert service["profiles"] == ["monitoring"], name
        binds = [str(v) for v in service["volumes"] if str(v).startswith("/")]
        assert binds, name
        for bind in binds:
            source, _target, mode = bind.split(":")
            assert mode == "ro", bind
            assert Path(source).exists(), bind
            assert Path(source).resolve().is_relative_to(REPO / "ops"), bind
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} has no authentication"


def test_grafana_has_no_default_admin_password(config: dict[str, Any]) -> None:
    """Grafana's admin password comes only from GRAFANA_ADMIN_PASSWORD; unset, it won't start."""
    grafana = _service(config, "grafana")
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == ""
    assert "exit 1" in " ".join(grafana["entrypoint"])


def test_prometheus_scrapes_the_app_services_on_their_metrics_port(
    config: dict[str, Any],
) -> None:
    """Every DNS name Prometheus scrapes is a compose service exporting on that port."""
    scrape = load_yaml(PROMETHEUS)
    seen: set[str] = set()
    for job in scrape["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            assert sd["type"] == "A"
            for name in sd["names"]:
                env = _service(config, name)["environment"]
                assert str(sd["port"]) == env["SOULFLEET_METRICS_PORT"], name
                seen.add(name)
    assert {"worker", "dream-worker", "beat"} <= seen

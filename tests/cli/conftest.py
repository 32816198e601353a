"""Fixtures for CLI tests: an isolated environment on the suite's real Redis.

Every CLI test runs with its own key prefix, personas root and data directory (``XDG_DATA_HOME``
points into the test's tmp dir), so no test ever adopts a `soulfleet up` a developer happens to
be running, and no test sees another's lanes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner, Result

from tests.support.cli import cli_environ, closed_port_url, copy_demo
from workers.cli import cli
from workers.cli.group import quiet_logging

Invoke = Callable[..., Result]


@pytest.fixture(autouse=True)
def cli_logging() -> Iterator[None]:
    """The CLI's quiet logging for each test, as the console script sets it, then whatever the
    session had before (so no other test inherits the CLI's configuration)."""
    was_configured = structlog.is_configured()
    saved = structlog.get_config()
    quiet_logging()
    try:
        yield
    finally:
        if was_configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()


@pytest.fixture
def fleet_root(tmp_path: Path) -> Path:
    """A personas root holding a copy of the demo personas (ava, milo, nora)."""
    return copy_demo(tmp_path / "fleet")


@pytest.fixture
def env(redis_url: str, key_prefix: str, fleet_root: Path, tmp_path: Path) -> dict[str, str | None]:
    """The environment a CLI command sees: this test's Redis, prefix, personas and data dir."""
    return cli_environ(
        os.environ,
        redis_url=redis_url,
        key_prefix=key_prefix,
        personas=fleet_root,
        data_home=tmp_path / "xdg",
    )


@pytest.fixture
def dead_redis_env(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """``env`` pointed at a closed port, with a password that must never be printed."""
    return {**env, "REDIS_URL": closed_port_url()}


@pytest.fixture
def invoke(env: Mapping[str, str | None]) -> Invoke:
    """Run ``soulfleet <args>`` in-process (CliRunner) with ``env`` (overridable per call)."""

    def run(*args: str, environ: Mapping[str, str | None] | None = None) -> Result:
        runner = CliRunner()
        return runner.invoke(cli, list(args), env=dict(environ or env), catch_exceptions=False)

    return run

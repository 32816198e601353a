"""Fixtures for beat's tests: a virtual clock, a fleet on the test Redis, captured log events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog
from structlog.testing import LogCapture

import beat.entries
import beat.reaper
import beat.scheduler
import beat.sweep
import beat.sync
from tests.support.beat import RecordingPublisher, fleet_for, settings_for
from workers.fleet import Fleet
from workers.persona.clock import VirtualClock
from workers.settings import Settings

NOW = 1_717_200_000.0  # 2024-06-01T00:00:00Z


class Events:
    """Log events beat's modules emitted during one test."""

    def __init__(self) -> None:
        self.capture = LogCapture()

    def named(self, event: str) -> list[dict[str, Any]]:
        return [dict(entry) for entry in self.capture.entries if entry["event"] == event]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Events:
    """Capture beat's structured log events, whatever structlog's global configuration is."""
    recorded = Events()
    logger = structlog.wrap_logger(
        None,
        processors=[structlog.processors.add_log_level, recorded.capture],
        wrapper_class=structlog.BoundLogger,
        cache_logger_on_first_use=False,
    )
    for module in (beat.entries, beat.reaper, beat.scheduler, beat.sweep, beat.sync):
        monkeypatch.setattr(module, "_log", logger)
    return recorded


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=NOW)


@pytest.fixture
def settings(redis_url: str, key_prefix: str, persona_root: Path) -> Settings:
    return settings_for(redis_url, key_prefix, persona_root)


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


@pytest.fixture
def fleet(
    settings: Settings,
    clock: VirtualClock,
    publisher: RecordingPublisher,
    redis_client: redis.Redis,
) -> Iterator[Fleet]:
    """A real Fleet on the test Redis (keys cleaned by ``redis_client``), on the virtual clock."""
    made = fleet_for(settings, clock=clock, publisher=publisher)
    try:
        yield made
    finally:
        made.client.close()

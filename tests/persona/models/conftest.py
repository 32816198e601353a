"""Fixtures for the model client tests: real fake-provider servers and a recording clock."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.support.providers import FakeProvider, RecordingClock


@pytest.fixture
def openai_server() -> Iterator[FakeProvider]:
    """A real OpenAI-compatible server on a free local port."""
    with FakeProvider("openai") as server:
        yield server


@pytest.fixture
def anthropic_server() -> Iterator[FakeProvider]:
    """A real Anthropic Messages server on a free local port."""
    with FakeProvider("anthropic") as server:
        yield server


@pytest.fixture
def clock() -> RecordingClock:
    """Real time, but retry waits are recorded instead of slept."""
    return RecordingClock()


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port

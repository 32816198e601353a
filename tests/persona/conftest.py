"""Fixtures shared by the persona core's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.persona import make_persona


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty persona directory (a test file may define its own ``home`` instead)."""
    return make_persona(tmp_path / "ava")

"""The baton (workers/turn/baton.py) in a real threads worker: on by default, and the turns it
hands round still wait on their model together."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from tests.support.providers import FakeProvider

pytestmark = pytest.mark.integration


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider("openai", delay=2.0, text="answered") as server:
        yield server


def test_turns_holding_the_baton_still_call_their_model_together(
    harness: Harness, provider: FakeProvider
) -> None:
    """Eight turns on eight threads against a 2 s model: all eight calls are in flight at once
    (each gives the baton up while it waits), every turn ends done, none waited out."""
    harness.configure(SOULFLEET_MODEL="openai:fake-model", OPENAI_BASE_URL=provider.base_url)
    names = [f"p{n}" for n in range(8)]
    for name in names:
        harness.persona(name)
    worker = harness.worker("w1", concurrency=8)
    for name in names:
        harness.fleet.post(name, "hello", wake=True)
    wait_until(
        lambda: len([e for e in harness.events("turn.end") if e["status"] == "done"]) == 8,
        timeout=60,
        what="8 turns",
    )
    assert provider.max_in_flight == 8
    (ready,) = worker.events("worker.ready")
    assert ready["baton"] is True
    waits = [e["baton_wait"] for e in harness.events("turn.end")]
    assert len(waits) == 8  # each turn says what it waited
    assert all(0 <= w < 2 for w in waits)
    assert worker.events("baton.waited_out") == []


def test_the_baton_can_be_turned_off(harness: Harness, provider: FakeProvider) -> None:
    """``SOULFLEET_TURN_BATON=0``: the worker says so, and its turns run as before."""
    harness.configure(
        SOULFLEET_MODEL="openai:fake-model",
        OPENAI_BASE_URL=provider.base_url,
        SOULFLEET_TURN_BATON="0",
    )
    harness.persona("ava")
    worker = harness.worker("w1", concurrency=4)
    harness.fleet.post("ava", "hello", wake=True)
    wait_until(lambda: harness.events("turn.end"), timeout=60, what="the turn")
    (ready,) = worker.events("worker.ready")
    assert ready["baton"] is False
    (end,) = harness.events("turn.end")
    assert end["status"] == "done"
    assert "baton_wait" not in end

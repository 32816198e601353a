"""The fleet-wide turn gate, witnessed by the model server itself: it counts how many requests
it was answering at once, across two real worker processes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from tests.support.providers import FakeProvider

pytestmark = pytest.mark.integration


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider("openai", delay=0.5, text="answered") as server:
        yield server


def _use(harness: Harness, provider: FakeProvider, limit: int) -> None:
    harness.configure(
        SOULFLEET_MODEL="openai:fake-model",
        OPENAI_BASE_URL=provider.base_url,
        SOULFLEET_MAX_CONCURRENT_MODEL_CALLS=str(limit),
        SOULFLEET_GATE_SLOT_TTL="2",
        SOULFLEET_MODEL_RETRIES="0",
    )


def test_gate_caps_model_calls_across_two_workers(harness: Harness, provider: FakeProvider) -> None:
    """K=2 with 8 pool threads on two hosts' worth of workers: the server never sees more than
    2 requests at once, and it does see 2 (the gate was contended, not idle)."""
    _use(harness, provider, limit=2)
    names = [f"p{n}" for n in range(12)]
    for name in names:
        harness.persona(name)
    harness.worker("w1", concurrency=4)
    harness.worker("w2", concurrency=4)

    for name in names:
        harness.fleet.post(name, "hello", wake=True)
    wait_until(
        lambda: len([e for e in harness.events("turn.end") if e["status"] == "done"]) == 12,
        timeout=90,
        what="12 turns",
    )
    assert provider.max_in_flight == 2
    assert len(provider.requests) == 12
    assert {e["_process"] for e in harness.events("turn.end")} == {"w1", "w2"}


def test_a_holder_killed_mid_call_does_not_leak_its_slot(
    harness: Harness, provider: FakeProvider
) -> None:
    """K=1: the worker holding the only slot is SIGKILLed mid-call; after the slot TTL another
    worker's turn gets the slot and completes."""
    _use(harness, provider, limit=1)
    harness.persona("first")
    harness.persona("second")
    provider.delay = 60  # the first call hangs until its worker dies
    w1 = harness.worker("w1", concurrency=2)
    harness.fleet.post("first", "hello", wake=True)
    wait_until(lambda: provider.in_flight == 1, timeout=30, what="the call in flight")
    gate_key = harness.fleet.keys.gate
    assert harness.fleet.client.zcard(gate_key) == 1

    w1.kill()
    killed_at = time.monotonic()
    provider.delay = 0
    w2 = harness.worker("w2", concurrency=2)
    harness.fleet.post("second", "hello", wake=True)
    done = wait_until(
        lambda: [e for e in w2.events("turn.end") if e["lane"] == "second"],
        timeout=60,
        what="the second persona's turn",
    )
    freed_after = time.monotonic() - killed_at
    print(f"\nslot of a killed holder freed and reused after {freed_after:.2f}s (slot TTL 2s)")
    assert done[0]["status"] == "done"
    # The dead holder's request is still parked in the server; the gate itself is empty again.
    assert harness.fleet.client.zcard(gate_key) == 0
    assert len(provider.requests) == 2

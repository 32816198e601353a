"""Usage in Redis equals the provider's bill across SIGKILLed workers and retried turns.

Real worker and beat processes, a real Redis, a real HTTP model server that records every
answer it delivered to a live client (its "bill"). While the fleet beats, the server answers
some calls with 500 (the turn fails and is retried) and a worker is SIGKILLed several times
with calls in flight (its turns are reaped and run again elsewhere). Afterwards the tokens and
calls Redis counted, persona by persona, are exactly what the server billed: nothing lost
with the killed workers, nothing counted twice by the retries.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import FleetProcess, wait_until
from tests.support.providers import FakeProvider, error_reply, openai_completion

pytestmark = pytest.mark.integration

PERSONAS = [f"p{n:02d}" for n in range(20)]
KILLS = 3


def _tokens(body: dict[str, object]) -> tuple[int, int]:
    return 5 + len(str(body["messages"])) % 53, 2 + len(str(body["messages"])) % 7


def _answer(body: dict[str, Any]) -> str | dict[str, Any]:
    """Two calls a turn: first a tool call (to a tool that does not exist: the loop answers it
    with an error result), then the silent reply. A worker killed between the two has been
    billed for the first call of a turn that never commits."""
    if body["messages"][-1]["role"] != "user":
        return "HEARTBEAT_OK"
    tokens_in, tokens_out = _tokens(body)
    return openai_completion(
        None,
        [("call_1", "look_around", {})],
        model=str(body["model"]),
        prompt_tokens=tokens_in,
        completion_tokens=tokens_out,
    )


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider("openai", delay=0.3, answer=_answer, tokens=_tokens) as provider:
        yield provider


def test_usage_equals_the_bill_across_sigkilled_workers_and_retries(
    harness: Harness, server: FakeProvider
) -> None:
    """SIGKILLs with calls in flight and 500s from the provider: Redis usage == the bill."""
    harness.use_model_server(
        server,
        SOULFLEET_LEASE_TTL="2",
        SOULFLEET_MAX_ATTEMPTS="20",
        SOULFLEET_SWEEP_INTERVAL="0.2",
        SOULFLEET_REAP_INTERVAL="0.5",
        SOULFLEET_REAP_QUEUED_AFTER="5",
    )
    for name in PERSONAS:
        harness.persona(
            name, toml='[heartbeat]\nevery = "1s"\n', files={"HEARTBEAT.md": "- look around\n"}
        )
    victims: list[FleetProcess] = []
    steady = harness.worker("steady", concurrency=4)
    victim = harness.worker("victim0", concurrency=8)
    beat = harness.beat()
    unbilled_at_kill = 0
    for round_ in range(KILLS):
        wait_until(partial(victim.events, "turn.start"), timeout=60, what="victim turns")
        server.enqueue(*[error_reply("openai", 500, "overloaded")] * 2)
        time.sleep(2.0)
        server.pause()  # answers in flight are held; the victim's will find no one to answer
        time.sleep(1.5)  # answers delivered before the pause have been counted by now
        held = server.in_flight
        victim.kill()
        victims.append(victim)
        unbilled_at_kill += held
        victim = harness.worker(f"victim{round_ + 1}", concurrency=8)
        server.resume()
    time.sleep(3.0)
    beat.stop()
    harness.drain(timeout=120)
    workers = [steady, victim, *victims]
    ends = [end for worker in workers for end in worker.events("turn.end")]
    starts = [start for worker in workers for start in worker.events("turn.start")]
    errors = sum(1 for end in ends if end["status"] == "error")
    recovered = sum(1 for start in starts if start["attempt"] > 1)
    unbilled = len(server.requests) - len(server.served) - errors
    print(
        f"\ncalls received {len(server.requests)}, billed {len(server.served)}, "
        f"500s {errors}, held at a kill {unbilled_at_kill}, never answered {unbilled}, "
        f"retried turns {recovered}, killed after a billed first call "
        f"{sum(1 for b in server.dropped if b['messages'][-1]['role'] == 'tool')}"
    )
    assert errors >= 1, "some turns failed on a 500 and were retried"
    assert recovered >= 1, "some turns ran again after a crash or a failure"
    assert unbilled >= 1, "some calls died with a killed worker before being answered"
    paid_then_killed = [b for b in server.dropped if b["messages"][-1]["role"] == "tool"]
    assert paid_then_killed, "some killed turns had a first call billed and never committed"

    billed: dict[str, Counter[str]] = defaultdict(Counter)
    for served in server.served:
        persona = str(served.body["messages"][0]["content"]).split("You are ")[1].split(".")[0]
        billed[persona].update(
            {"input": served.input_tokens, "output": served.output_tokens, "calls": 1}
        )
    counted = {
        entry["persona"]: Counter(
            {"input": entry["input"], "output": entry["output"], "calls": entry["calls"]}
        )
        for entry in harness.fleet.usage(days=1)
    }
    assert counted == dict(billed)

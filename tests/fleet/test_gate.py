"""The fleet-wide turn gate: a Redis semaphore whose slots expire with their holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from tests.support.lanes import make_breaker
from workers.fleet.errors import GateTimeout
from workers.fleet.gate import Gate, GatedModel, ModelCall
from workers.fleet.keys import Keys
from workers.fleet.lease import Renewer
from workers.fleet.scripts import run_scripts
from workers.fleet.usage import MeteredModel, UsageLedger
from workers.local.redis_server import free_port
from workers.persona.clock import SystemClock, VirtualClock
from workers.persona.errors import ModelError, TurnTimeUp
from workers.persona.messages import Completion, Message, ToolSpec
from workers.persona.models import Model
from workers.persona.turn_time import turn_deadline

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=1_700_000_000.0)


@pytest.fixture
def renewer() -> Iterator[Renewer]:
    r = Renewer(ttl=30)
    yield r
    r.stop()


def _gate(
    client: redis.Redis,
    prefix: str,
    clock: VirtualClock | None,
    renewer: Renewer,
    *,
    limit: int = 2,
    slot_ttl: float = 10.0,
) -> Gate:
    return Gate(client, Keys(prefix), limit=limit, slot_ttl=slot_ttl, renewer=renewer, clock=clock)


def test_acquire_grants_up_to_limit_and_release_frees_a_slot(
    redis_client: redis.Redis, key_prefix: str, clock: VirtualClock, renewer: Renewer
) -> None:
    """limit slots are granted, the next holder is refused until one is released."""
    gate = _gate(redis_client, key_prefix, clock, renewer)
    assert gate.acquire("a")
    assert gate.acquire("b")
    assert not gate.acquire("c")
    assert gate.acquire("a"), "a holder asking again keeps its slot"
    assert gate.holders() == 2
    assert gate.release("a")
    assert gate.acquire("c")
    assert not gate.release("zzz")


def test_an_expired_slot_is_reclaimed_and_renewal_keeps_a_slot(
    redis_client: redis.Redis, key_prefix: str, clock: VirtualClock, renewer: Renewer
) -> None:
    """A holder that stops renewing loses its slot after slot_ttl; one that renews keeps it."""
    gate = _gate(redis_client, key_prefix, clock, renewer)
    assert gate.acquire("dies")
    assert gate.acquire("lives")
    clock.advance(6)
    assert gate.renew_many(["lives", "nobody"]) == [True, False]
    clock.advance(5)
    assert gate.holders() == 1
    assert gate.acquire("new")
    assert not gate.renew("dies")
    assert gate.renew("lives")


def test_slot_waits_then_times_out_with_a_retryable_model_error(
    redis_client: redis.Redis, key_prefix: str, clock: VirtualClock, renewer: Renewer
) -> None:
    """With every slot held, slot(timeout) polls on the clock and raises GateTimeout."""
    gate = _gate(redis_client, key_prefix, clock, renewer, limit=1, slot_ttl=60)
    assert gate.acquire("hog")
    before = REGISTRY.get_sample_value("soulfleet_turn_gate_wait_seconds_count") or 0.0
    with pytest.raises(GateTimeout) as caught, gate.slot(timeout=2.0):
        pytest.fail("must not get a slot")
    assert isinstance(caught.value, ModelError)
    assert caught.value.retryable
    assert 2.0 <= caught.value.waited < 2.5
    assert REGISTRY.get_sample_value("soulfleet_turn_gate_wait_seconds_count") == before + 1


def test_slot_registers_with_the_renewer_and_releases_on_exit(
    redis_client: redis.Redis, key_prefix: str, renewer: Renewer
) -> None:
    """Inside slot() the holder is renewed by the Renewer; on exit it is released."""
    gate = _gate(redis_client, key_prefix, None, renewer)
    with gate.slot(timeout=5) as slot:
        assert slot.token is not None
        assert slot.handle is not None
        assert gate.holders() == 1
        assert len(renewer) == 1
        renewer.renew_now()
        assert not slot.handle.lost.is_set()
    assert gate.holders() == 0
    assert len(renewer) == 0


def test_a_slot_a_stopped_renewer_refuses_is_handed_back_at_once(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """The renewer already stopped (a worker shutting down): slot() raises, and the slot it
    had acquired is released now, not held unrenewed until slot_ttl frees it."""
    stopped = Renewer(ttl=30)
    stopped.stop()
    gate = _gate(redis_client, key_prefix, None, stopped, limit=1, slot_ttl=600.0)
    with pytest.raises(RuntimeError, match="renewer is stopped"), gate.slot(timeout=5):
        pass
    assert gate.holders() == 0


def test_limit_zero_is_unlimited_and_never_calls_redis(renewer: Renewer) -> None:
    """An unlimited gate hands out slots even with no Redis reachable at all."""
    dead = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", decode_responses=True)
    gate = Gate(dead, Keys("x:"), limit=0, slot_ttl=10, renewer=renewer)
    with gate.slot(timeout=0.1) as first, gate.slot(timeout=0.1) as second:
        assert (first.token, second.token) == (None, None)
    assert len(renewer) == 0


class _Probe:
    """A stand-in model that records how many gate slots are held while it answers."""

    def __init__(self, gate: Gate, fail: bool = False) -> None:
        self.gate = gate
        self.fail = fail
        self.holders_seen: list[int] = []

    @property
    def spec(self) -> str:
        return "probe:test"

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        self.holders_seen.append(self.gate.holders())
        if self.fail:
            raise ModelError("provider down")
        return Completion(text=f"answer to {messages[-1].content}")


def test_gated_model_holds_a_slot_only_during_complete(
    redis_client: redis.Redis, key_prefix: str, renewer: Renewer
) -> None:
    """GatedModel takes a slot around complete(), observes its time and reports each call."""
    gate = _gate(redis_client, key_prefix, None, renewer)
    probe = _Probe(gate)
    calls: list[ModelCall] = []
    model = GatedModel(probe, gate, provider="scripted", on_call=calls.append)
    assert isinstance(model, Model)
    assert model.spec == "probe:test"
    before = (
        REGISTRY.get_sample_value("soulfleet_model_call_seconds_count", {"provider": "scripted"})
        or 0.0
    )
    answer = model.complete(system="s", messages=[Message(role="user", content="hi")], tools=[])
    assert answer.text == "answer to hi"
    assert probe.holders_seen == [1]
    assert gate.holders() == 0
    assert [(c.provider, c.error) for c in calls] == [("scripted", None)]
    assert (
        REGISTRY.get_sample_value("soulfleet_model_call_seconds_count", {"provider": "scripted"})
        == before + 1
    )


def test_gated_model_releases_the_slot_when_the_call_fails(
    redis_client: redis.Redis, key_prefix: str, renewer: Renewer
) -> None:
    """A failing model call still gives its slot back and is reported with its error."""
    gate = _gate(redis_client, key_prefix, None, renewer)
    calls: list[ModelCall] = []
    model = GatedModel(_Probe(gate, fail=True), gate, on_call=calls.append)
    with pytest.raises(ModelError, match="provider down"):
        model.complete(system="s", messages=[Message(role="user", content="hi")], tools=[])
    assert gate.holders() == 0
    assert calls[0].provider == "other"
    assert calls[0].error == "ModelError: provider down"


def test_a_gate_wait_inside_a_turn_ends_at_the_turns_limit(
    redis_client: redis.Redis, key_prefix: str, renewer: Renewer
) -> None:
    """Every slot held: inside a turn with 0.3 s left the call waits no longer than that and
    ends as TurnTimeUp (the turn ends incomplete), not after its own 30 s wait as a
    GateTimeout that fails and re-runs the turn; outside a turn it is GateTimeout as before."""
    gate = _gate(redis_client, key_prefix, None, renewer, limit=1)
    assert gate.acquire("hog")
    model = GatedModel(_Probe(gate), gate, timeout=30.0)
    began = time.monotonic()
    with turn_deadline(0.3), pytest.raises(TurnTimeUp, match="SOULFLEET_TURN_MAX_SECONDS"):
        model.complete(system="s", messages=[Message(role="user", content="hi")], tools=[])
    assert time.monotonic() - began < 5.0
    short = GatedModel(_Probe(gate), gate, timeout=0.3)
    with pytest.raises(GateTimeout):
        short.complete(system="s", messages=[Message(role="user", content="hi")], tools=[])


class _CountingConnection(redis.Connection):
    """A real connection that counts its writes to the socket (round trips, for a client that
    waits for each reply)."""

    sends = 0

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        type(self).sends += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def test_an_answered_call_settles_usage_slot_and_breaker_in_one_round_trip(
    redis_url: str, key_prefix: str, renewer: Renewer
) -> None:
    """After the model answers, its usage record, the slot's release and the breaker's count of
    a success go to Redis together: one write to the socket, and each lands as if sent alone."""
    pool = redis.ConnectionPool.from_url(
        redis_url, decode_responses=True, connection_class=_CountingConnection
    )
    client = redis.Redis(connection_pool=pool)
    keys = Keys(key_prefix)
    gate = Gate(client, keys, limit=2, slot_ttl=10, renewer=renewer)
    breaker = make_breaker(client, key_prefix, clock=SystemClock())
    ledger = UsageLedger(client, keys, days=2)
    probe = _Probe(gate)
    metered = MeteredModel(
        probe, ledger, persona="ava", day="2026-11-30", call_prefix="ava:t1:1", kind="interactive",
        provider="openai",
    )  # fmt: skip
    model = GatedModel(metered, gate, provider="openai", breaker=breaker)
    model.seen_closed()  # as a turn that read the breaker closed: the call itself asks nothing
    sends: list[int] = []
    original = model._settle

    def counted(*args: object, **kwargs: object) -> None:
        before = _CountingConnection.sends
        original(*args, **kwargs)  # type: ignore[arg-type]
        sends.append(_CountingConnection.sends - before)

    model._settle = counted  # type: ignore[method-assign]
    for _ in range(2):  # the first call also loads the scripts into this Redis
        answer = model.complete(system="s", messages=[Message(role="user", content="hi")], tools=[])
        assert answer.text == "answer to hi"
    assert sends[1] == 1
    assert probe.holders_seen == [1, 1]
    assert gate.holders() == 0
    [state] = breaker.states()
    assert (state.calls_total, state.failures_total) == (2, 0)
    assert metered.spent_today == ledger.spent("ava", "2026-11-30")
    assert ledger.usage(["ava"], ["2026-11-30"])[0].calls == 2
    client.close()


def test_a_script_batch_survives_a_script_flush(redis_client: redis.Redis, key_prefix: str) -> None:
    """A batch sent after Redis forgot its scripts (a restart, SCRIPT FLUSH) still runs every
    call once, in order, with the same replies."""
    gate = Gate(redis_client, Keys(key_prefix), limit=3, slot_ttl=10)
    assert gate.acquire("a")
    assert gate.acquire("b")
    redis_client.script_flush()
    replies = run_scripts(
        redis_client, [gate.release_call("a"), gate.release_call("zzz"), gate.release_call("b")]
    )
    assert [bool(r) for r in replies] == [True, False, True]
    assert gate.holders() == 0


def _child(mode: str, url: str, prefix: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.lanes",
            mode,
            "--url",
            url,
            "--prefix",
            prefix,
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.integration
def test_two_processes_never_exceed_the_limit(
    redis_client: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    """Threads in two real processes contending for K=3 slots: at most 3 ever hold one."""
    args = ("--limit", "3", "--threads", "4", "--seconds", "3")
    children = [_child("gate-contend", redis_url, key_prefix, *args) for _ in range(2)]
    for child in children:
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0, out
    peak = int(redis_client.get(f"{key_prefix}t:peak") or 0)
    calls = int(redis_client.get(f"{key_prefix}t:calls") or 0)
    assert calls > 50, "too little contention for the test to mean anything"
    assert 2 <= peak <= 3
    assert int(redis_client.get(f"{key_prefix}t:active") or 0) == 0


@pytest.mark.integration
def test_a_sigkilled_holder_does_not_leak_its_slot(
    redis_client: redis.Redis, redis_url: str, key_prefix: str, renewer: Renewer
) -> None:
    """A holder killed mid-call stops renewing; after slot_ttl its slot is free again."""
    child = _child("gate-hold", redis_url, key_prefix, "--limit", "1", "--slot-ttl", "1.0")
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("held "), line
        gate = Gate(redis_client, Keys(key_prefix), limit=1, slot_ttl=1.0, renewer=renewer)
        # Renewed past its TTL while the holder lives:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert not gate.acquire("me"), "the live holder's slot was given away"
            time.sleep(0.1)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        killed = time.monotonic()
        deadline = killed + 10
        while not gate.acquire("me"):
            assert time.monotonic() < deadline, "slot leaked"
            time.sleep(0.05)
        assert time.monotonic() - killed < 2.0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_in_flight_names_each_held_slots_lane_worker_and_start(
    redis_client: redis.Redis, key_prefix: str, clock: VirtualClock, renewer: Renewer
) -> None:
    """A slot taken for lane ava is listed with the lane, this worker (host:pid) and when it
    was taken, oldest first; a released one is not; a token of the older format is skipped."""
    gate = _gate(redis_client, key_prefix, clock, renewer, limit=3)
    redis_client.zadd(Keys(key_prefix).gate, {"oldhost:12:" + "a" * 32: 1e15})
    with gate.slot(timeout=1, lane="ava"):
        clock.advance(5)
        with gate.slot(timeout=1, lane="bob"):
            calls = gate.in_flight()
            assert [(c.lane, c.started) for c in calls] == [
                ("ava", 1_700_000_000.0), ("bob", 1_700_000_005.0)
            ]  # fmt: skip
            assert calls[0].holder.endswith(f":{os.getpid()}")
        assert [c.lane for c in gate.in_flight()] == ["ava"]
    assert gate.in_flight() == []


def test_a_calls_start_is_when_it_took_its_slot_not_when_it_began_waiting(
    redis_client: redis.Redis, key_prefix: str, renewer: Renewer
) -> None:
    """With the gate full, bob waits ~1 s for ava's slot: his call's start is when he took it
    (a wait for a full gate counted as a call in flight read as a hanging provider)."""
    gate = _gate(redis_client, key_prefix, None, renewer, limit=1)
    taken = threading.Event()

    def hold() -> None:
        with gate.slot(timeout=5, lane="ava"):
            taken.set()
            time.sleep(1.0)

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(5)
    asked = time.time()
    with gate.slot(timeout=10, lane="bob"):
        [call] = gate.in_flight()
        assert call.lane == "bob"
        assert call.started >= asked + 0.5
    holder.join()

"""The provider breaker on a real Redis: it opens on mostly failing calls, refuses calls while
open (one probe per interval), closes on a success; deferred lanes spend no attempt and are
resumed by the recovery pass."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import redis

from tests.support.lanes import item, make_breaker, make_lanes
from workers.fleet.breaker import Breaker
from workers.fleet.errors import ProviderPaused
from workers.fleet.gate import Gate, GatedModel
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.recovery import Recovery
from workers.persona.clock import VirtualClock
from workers.persona.errors import ModelAuthError, ModelServerError
from workers.persona.messages import Completion, Message, ToolSpec


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=1_700_000_000.0)


@pytest.fixture
def breaker(redis_client: redis.Redis, key_prefix: str, clock: VirtualClock) -> Breaker:
    return make_breaker(redis_client, key_prefix, clock=clock)


@pytest.fixture
def lanes(redis_client: redis.Redis, key_prefix: str, clock: VirtualClock) -> Lanes:
    return make_lanes(redis_client, key_prefix, clock=clock, max_attempts=2)


def test_it_opens_only_when_most_calls_in_the_window_fail(
    breaker: Breaker, clock: VirtualClock
) -> None:
    """Three failures are below min_calls; a success mix under the ratio stays closed; the
    fourth failure of four opens it."""
    for _ in range(3):
        assert breaker.record("openai", ok=False, error="500") == "closed"
    assert breaker.allow("openai") == "closed"
    assert breaker.record("openai", ok=False, error="500") == "opened"
    assert breaker.allow("openai") == "open"
    assert breaker.allow("anthropic") == "closed"  # per provider
    clock.advance(100)  # long after the window: a fresh provider record stays closed
    other = "anthropic"
    for ok in (True, True, True, False, True, False):
        assert breaker.record(other, ok=ok) == "closed"


def test_while_open_one_probe_per_interval_and_a_success_closes_it(
    breaker: Breaker, clock: VirtualClock
) -> None:
    """Before probe_at: refused. Then exactly one caller probes; a failed probe pushes the next
    probe one interval on; a successful one closes the breaker."""
    for _ in range(4):
        breaker.record("openai", ok=False, error="500")
    assert breaker.allow("openai") == "open"
    clock.advance(10)
    assert [breaker.allow("openai") for _ in range(3)] == ["probe", "open", "open"]
    assert breaker.record("openai", ok=False, error="refused", probe=True) == "open"
    assert breaker.allow("openai") == "open"
    clock.advance(10)
    assert breaker.allow("openai") == "probe"
    assert breaker.record("openai", ok=True) == "closed_now"
    assert breaker.allow("openai") == "closed"
    [state] = breaker.states()
    assert (state.open, state.calls_total, state.failures_total, state.probes) == (
        False,
        6,
        5,
        2,
    )


def test_a_probe_whose_worker_died_frees_its_slot_when_its_lane_is_reaped(
    breaker: Breaker, clock: VirtualClock
) -> None:
    """The probe's worker dies mid-call (SIGKILL): its slot was held for the whole probe ttl
    (20 minutes at the defaults), every deferred lane of the provider waiting that long after
    the provider recovered. The reap of its lane frees it: the next probe goes at once. A
    reap of another lane frees nothing."""
    for _ in range(4):
        breaker.record("openai", ok=False, error="500")
    clock.advance(10)
    assert breaker.allow("openai", "p16") == "probe"
    clock.advance(30)  # within the probe ttl (60 s here)
    assert breaker.allow("openai", "p05") == "open"  # p16's probe holds the slot
    assert breaker.release_probes(["p01", "p05"]) == []
    assert breaker.allow("openai", "p05") == "open"
    assert breaker.release_probes(["p16"]) == ["openai"]
    assert breaker.allow("openai", "p05") == "probe"
    assert breaker.release_probes(["p16"]) == []  # p05 probes now; p16 holds nothing
    # A probe that reported (here failed) holds nothing: a later crash of its lane frees
    # nothing, and says nothing of a dead probe.
    breaker.record("openai", ok=False, error="500", probe=True)
    assert breaker.release_probes(["p05"]) == []


class _Failing:
    spec = "openai:fake"

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        self.calls += 1
        raise self.error


def test_a_gated_model_stops_calling_a_provider_whose_breaker_opened(
    breaker: Breaker, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Four 500s open the breaker; the fifth call raises ProviderPaused without reaching the
    model. 401s never open it (one persona's key is not an outage)."""
    gate = Gate(redis_client, Keys(key_prefix), limit=0, slot_ttl=30)
    auth = _Failing(ModelAuthError("401"))
    refused = GatedModel(auth, gate, provider="anthropic", breaker=breaker)
    for _ in range(6):
        with pytest.raises(ModelAuthError):
            refused.complete(system="", messages=(), tools=())
    assert auth.calls == 6
    assert breaker.allow("anthropic") == "closed"

    down = _Failing(ModelServerError("500"))
    model = GatedModel(down, gate, provider="openai", breaker=breaker)
    for _ in range(4):
        with pytest.raises(ModelServerError):
            model.complete(system="", messages=(), tools=())
    with pytest.raises(ProviderPaused):
        model.complete(system="", messages=(), tools=())
    assert down.calls == 4


def test_a_breaker_seen_closed_lets_only_the_next_call_skip_asking(
    breaker: Breaker, redis_client: redis.Redis, key_prefix: str, clock: VirtualClock
) -> None:
    """``look`` reads closed / paused / probe_due without side effects; after the turn saw it
    closed, the model's next call goes without ``allow`` (no round trip), and every later call
    asks again: a breaker that opened meanwhile stops the second call."""
    gate = Gate(redis_client, Keys(key_prefix), limit=0, slot_ttl=30)
    down = _Failing(ModelServerError("500"))
    model = GatedModel(down, gate, provider="openai", breaker=breaker)
    assert breaker.look("openai") == "closed"
    model.seen_closed()
    for _ in range(4):  # another worker's failures open the breaker in the meantime
        breaker.record("openai", ok=False, error="500")
    assert breaker.look("openai") == "paused"
    with pytest.raises(ModelServerError):
        model.complete(system="", messages=(), tools=())  # seen closed: no allow asked
    with pytest.raises(ProviderPaused):
        model.complete(system="", messages=(), tools=())
    assert down.calls == 1
    clock.advance(10)
    assert [breaker.look("openai") for _ in range(2)] == ["probe_due", "probe_due"]
    assert breaker.allow("openai") == "probe"
    assert breaker.look("openai") == "paused"


def test_deferred_lanes_spend_no_attempt_and_resume_when_the_breaker_closes(
    lanes: Lanes, breaker: Breaker, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """Deferring a started turn five times (max_attempts 2) never dead-letters it; while open
    the recovery pass releases one lane per due probe; once closed it releases every one."""
    recovery = Recovery(lanes, breaker, claim_ttl=6)
    for _ in range(4):
        breaker.record("openai", ok=False, error="500")
    names = ["a", "b", "c"]
    for name in names:
        turn_id = lanes.post(name, item("hi"), wake=True).turn_id
        assert turn_id is not None
        for _ in range(5):
            started = lanes.start(name, turn_id, "w1")
            assert started.status == "started"
            turn_id = lanes.defer(name, started.fence, provider="openai", why="paused")
            redis_client.hset(lanes.keys.lane(name), "state", "queued")  # as a release would
        redis_client.hset(lanes.keys.lane(name), "state", "deferred")
    assert [lanes.status(n)["state"] for n in names] == ["deferred"] * 3
    assert lanes.status("a")["attempts"] == 0
    assert lanes.waiting() == {"retry": 0, "deferred": 3}

    assert recovery.resume_deferred() == []  # open, probe not due yet
    clock.advance(10)
    probe = recovery.resume_deferred()
    assert len(probe) == 1
    assert lanes.waiting()["deferred"] == 2
    assert breaker.allow("openai") == "probe"
    assert recovery.resume_deferred() == []  # a probe is in flight
    breaker.record("openai", ok=True)
    resumed = recovery.resume_deferred()
    assert sorted(r.lane for r in resumed) == sorted(set(names) - {probe[0].lane})
    assert all(r.reason == "resumed" for r in resumed)
    assert [lanes.status(n)["state"] for n in names] == ["queued"] * 3


def test_look_is_read_only_and_a_failed_probe_always_reports(
    breaker: Breaker, clock: VirtualClock, redis_client: redis.Redis, key_prefix: str
) -> None:
    """look() says "paused" (defer before writing anything) while no probe may go, without
    taking the probe; a probe that fails for a reason not counted against the provider (here a
    401) still reports, so the next probe comes one interval later, not after the probe ttl."""
    assert breaker.look("openai") == "closed"
    for _ in range(4):
        breaker.record("openai", ok=False, error="500")
    assert breaker.look("openai") == "paused"
    clock.advance(10)
    assert breaker.look("openai") == "probe_due"  # the turn goes on to take the probe
    assert breaker.look("openai") == "probe_due"  # and asking again did not take it
    gate = Gate(redis_client, Keys(key_prefix), limit=0, slot_ttl=30)
    probe = GatedModel(_Failing(ModelAuthError("401")), gate, provider="openai", breaker=breaker)
    with pytest.raises(ModelAuthError):
        probe.complete(system="", messages=(), tools=())
    assert breaker.look("openai") == "paused"
    clock.advance(10)
    assert breaker.allow("openai") == "probe"


def test_a_straggler_failing_while_the_probe_runs_does_not_let_a_second_probe_go(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Open, the probe handed out and still running (its ttl far longer than the interval): a
    call that started before the breaker opened fails now. That failure is not the probe's:
    the probe slot stays taken and no second probe goes an interval later; the probe's own
    failure then frees it for the next one."""
    clock = VirtualClock(start=1_700_000_000.0)
    breaker = make_breaker(redis_client, key_prefix, clock=clock)
    for _ in range(4):
        breaker.record("openai", ok=False, error="500")
    assert breaker.allow("openai") == "open"
    clock.advance(10)
    assert breaker.allow("openai") == "probe"
    clock.advance(1)
    breaker.record("openai", ok=False, error="500 (a straggler)")
    clock.advance(11)
    assert breaker.allow("openai") == "open"
    breaker.record("openai", ok=False, error="500 (the probe)", probe=True)
    clock.advance(11)
    assert breaker.allow("openai") == "probe"

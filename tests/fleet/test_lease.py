"""The Renewer: one thread keeping leases and slots alive, and noticing when they are lost."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.lanes import item, make_lanes
from workers.fleet.errors import LeaseLost
from workers.fleet.gate import Gate
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.lease import LeaseHandle, Renewer
from workers.local.redis_server import free_port
from workers.persona.errors import TurnAborted


@pytest.fixture
def renewer() -> Iterator[Renewer]:
    r = Renewer(ttl=0.6)
    yield r
    r.stop()


def _start(lanes: Lanes, lane: str = "ava") -> int:
    turn = lanes.post(lane, item("hi"), wake=True).turn_id
    assert turn is not None
    started = lanes.start(lane, turn, "w1")
    assert started.status == "started"
    return started.fence


def test_interval_is_a_third_of_the_ttl_and_follows_a_shorter_gate_slot(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Three renewals per TTL (lanes' lease_ttl by default); a gate with a shorter slot_ttl
    tightens the interval so its slots never lapse between passes."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=30)
    assert Renewer(lanes).interval == 10
    assert Renewer(ttl=30, interval=2).interval == 2
    renewer = Renewer(lanes)
    Gate(redis_client, Keys(key_prefix), limit=1, slot_ttl=3, renewer=renewer)
    assert renewer.interval == 1
    with pytest.raises(ValueError, match="ttl"):
        Renewer()


def test_register_lease_uses_the_renewers_own_lanes(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """Renewer(lanes).register_lease(lane, fence) renews through those lanes."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=30)
    renewer = Renewer(lanes)
    fence = _start(lanes)
    lease = renewer.register_lease("ava", fence)
    redis_client.pexpire(Keys(key_prefix).lease("ava"), 5000)
    renewer.renew_now()
    assert redis_client.pttl(Keys(key_prefix).lease("ava")) > 5000
    renewer.unregister(lease)
    renewer.unregister(lease)
    assert len(renewer) == 0
    renewer.stop()


@pytest.mark.integration
def test_a_registered_lease_outlives_its_ttl(
    redis_client: redis.Redis, key_prefix: str, renewer: Renewer
) -> None:
    """The renewer thread keeps a 0.6 s lease alive for more than three TTLs."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=0.6)
    fence = _start(lanes)
    with renewer.register_lease("ava", fence, lanes=lanes) as lease:
        assert len(renewer) == 1
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert lease.holds(), "lease lapsed although it was being renewed"
            time.sleep(0.05)
        lease.check()
    assert len(renewer) == 0


def test_an_unrenewed_lease_does_lapse(redis_client: redis.Redis, key_prefix: str) -> None:
    """Control for the test above: without the renewer the same lease is gone after its TTL."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=0.3)
    fence = _start(lanes)
    deadline = time.monotonic() + 5.0
    while lanes.holds("ava", fence):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_lease_deleted_behind_its_back_is_lost_and_check_raises(
    redis_client: redis.Redis, key_prefix: str, renewer: Renewer
) -> None:
    """Once the lease key is gone, the next renewal marks the handle lost for good."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=0.6)
    fence = _start(lanes)
    lease = renewer.register_lease("ava", fence, lanes=lanes)
    redis_client.delete(Keys(key_prefix).lease("ava"))
    assert lease.lost.wait(timeout=5.0)
    with pytest.raises(LeaseLost) as caught:
        lease.check()
    assert isinstance(caught.value, TurnAborted)
    assert (caught.value.lane, caught.value.fence) == ("ava", fence)
    assert not lease.holds()


def test_a_takeover_marks_the_old_holder_lost_in_one_pass(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """A bumped fence is noticed by the next renewal pass; the new holder keeps its lease."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=30)
    renewer = Renewer(ttl=30)
    old_fence = _start(lanes)
    old = renewer.register_lease("ava", old_fence, lanes=lanes)
    redis_client.delete(Keys(key_prefix).lease("ava"))
    turn = lanes.status("ava")["turn_id"]
    assert isinstance(turn, str)
    new = renewer.register_lease("ava", lanes.start("ava", turn, "w2").fence, lanes=lanes)
    renewer.renew_now()
    assert old.lost.is_set()
    assert not new.lost.is_set()
    new.check()
    renewer.stop()


def test_holds_asks_redis_and_marks_a_lost_lease(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """holds() answers from Redis directly, without waiting for a renewal pass."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=30)
    fence = _start(lanes)
    lease = LeaseHandle(lanes, "ava", fence)
    assert lease.holds()
    lanes.finish("ava", fence, status="done", text="ok")
    assert not lease.holds()
    assert lease.lost.is_set()


def test_renewals_failing_for_longer_than_the_ttl_mark_the_lease_lost(key_prefix: str) -> None:
    """With Redis unreachable, a lease is declared lost once its TTL has passed unrenewed."""
    dead = redis.Redis.from_url(
        f"redis://127.0.0.1:{free_port()}/0", decode_responses=True, retry=Retry(NoBackoff(), 0)
    )
    lanes = make_lanes(dead, key_prefix, lease_ttl=0.3)
    renewer = Renewer(ttl=0.3)
    lease = LeaseHandle(lanes, "ava", 1)
    renewer.register(lease)
    renewer.stop()  # drive passes by hand: the thread's timing is not under test here
    renewer.renew_now()
    assert not lease.lost.is_set(), "one failed renewal within the TTL must not lose it"
    deadline = time.monotonic() + 5.0
    while not lease.lost.is_set():
        assert time.monotonic() < deadline
        time.sleep(0.05)
        renewer.renew_now()
    assert "renewals failed" in lease.lost_reason
    with pytest.raises(LeaseLost):
        lease.check()


def test_a_lost_handle_is_never_renewed_again(redis_client: redis.Redis, key_prefix: str) -> None:
    """A handle marked lost stays lost even while the fence would still accept renewals."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=30)
    renewer = Renewer(ttl=30)
    fence = _start(lanes)
    lease = renewer.register_lease("ava", fence, lanes=lanes)
    lease.mark_lost("test")
    redis_client.pexpire(Keys(key_prefix).lease("ava"), 5000)
    renewer.renew_now()
    assert redis_client.pttl(Keys(key_prefix).lease("ava")) <= 5000
    renewer.stop()


def test_stop_ends_the_thread_and_refuses_new_handles(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """stop() joins the renewal thread; registering afterwards is an error."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=30)
    renewer = Renewer(ttl=30, interval=0.05)
    renewer.register_lease("ava", 1, lanes=lanes)
    thread = renewer._thread
    assert thread is not None
    assert thread.is_alive()
    renewer.stop()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="stopped"):
        renewer.register_lease("ava", 1, lanes=lanes)


def test_a_turn_that_commits_during_a_renewal_pass_is_not_reported_lost(
    redis_client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal already in flight when its turn commits (finish deletes the lease, then the
    turn unregisters) finds the lease gone: that is the commit, not a loss, so the handle is
    not marked lost. The same "gone" for a handle still registered is a loss."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=30)
    renewer = Renewer(lanes)
    fence = _start(lanes)
    committed = renewer.register_lease("ava", fence)
    renew_many = lanes.renew_many

    def commit_first(leases: list[tuple[str, int]]) -> list[bool]:
        lanes.finish("ava", fence, status="done", text="ok")
        renewer.unregister(committed)
        return renew_many(leases)

    monkeypatch.setattr(lanes, "renew_many", commit_first)
    renewer.renew_now()
    assert not committed.lost.is_set()

    fence = _start(lanes)
    stolen = renewer.register_lease("ava", fence)
    monkeypatch.setattr(lanes, "renew_many", renew_many)
    redis_client.delete(Keys(key_prefix).lease("ava"))
    renewer.renew_now()
    assert stolen.lost.is_set()


def test_a_lease_not_renewed_for_most_of_its_ttl_stops_the_next_write(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """With no successful renewal for 80% of the TTL the holder cannot prove its lease is
    alive: check() marks it lost and raises, before the lease could expire under it."""
    lanes = make_lanes(redis_client, key_prefix, lease_ttl=1)
    fence = _start(lanes)
    handle = LeaseHandle(lanes, "ava", fence)  # registered with no renewer: never renewed
    handle.check()  # fresh: fine
    time.sleep(0.85)
    with pytest.raises(LeaseLost, match="no successful renewal"):
        handle.check()
    assert handle.lost.is_set()

"""The fenced session write (issue 11 rule 6) on a real Redis: a state file becomes current only
through ``finish.lua``'s fencing-checked commit, so a crashed or fenced-out turn adds nothing
and its retry starts from the same state; a reset during a turn wins over its write."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.support.lanes import item, make_lanes
from workers.fleet.errors import LeaseLost
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes, SessionCommit
from workers.persona.clock import VirtualClock
from workers.persona.messages import Message
from workers.persona.session import Pointer, SessionState
from workers.persona.session_files import SessionFiles


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(1_700_000_000.0)


@pytest.fixture
def lanes(redis_client: redis.Redis, key_prefix: str, clock: VirtualClock) -> Lanes:
    return make_lanes(redis_client, key_prefix, clock=clock)


def _state(turns: int, text: str) -> SessionState:
    messages = tuple(
        m
        for n in range(turns)
        for m in (Message("user", f"{text} {n}"), Message("assistant", "ok"))
    )
    return SessionState("s1", "ava", 0, 1.0, 2.0, "soul", messages=messages, turns=turns)


def _start(lanes: Lanes) -> int:
    posted = lanes.post("ava", item("hello"), wake=True)
    assert posted.turn_id is not None
    started = lanes.start("ava", posted.turn_id, "w1")
    assert started.status == "started"
    return started.fence


def test_a_state_written_by_a_turn_that_never_finished_is_never_current(
    lanes: Lanes, redis_client: redis.Redis, key_prefix: str, tmp_path: Path, clock: VirtualClock
) -> None:
    """Turn 1 writes its state file and dies before finish (SIGKILL after the write): the
    pointer never moves, the retry reads the old state, and only the retry's state commits."""
    files = SessionFiles(tmp_path, "ava")
    fence = _start(lanes)
    orphan = files.write(_state(1, "crashed"), f"f{fence}")
    redis_client.delete(Keys(key_prefix).lease("ava"))  # the dead worker's lease lapses
    clock.advance(31)
    (repair,) = lanes.reap(queued_after=600)
    retry = lanes.start("ava", repair.turn_id, "w2")
    assert retry.status == "started"
    assert lanes.session_pointer("ava") == Pointer(None, 0)
    assert files.read(lanes.session_pointer("ava").state) is None

    name = files.write(_state(1, "retried"), f"f{retry.fence}")
    done = lanes.finish(
        "ava", retry.fence, status="done", text="ok", session=SessionCommit(Pointer(), name)
    )
    assert done.session == "committed"
    assert lanes.session_pointer("ava") == Pointer(name, 0)
    current = files.read(name)
    assert current is not None
    assert [m.content for m in current.messages if m.role == "user"] == ["retried 0"]
    with pytest.raises(LeaseLost):  # the zombie can never make its state current
        lanes.finish(
            "ava", fence, status="done", text="late", session=SessionCommit(Pointer(), orphan)
        )
    assert lanes.session_pointer("ava").state == name
    assert files.collect({name}, tag_prefix="f") == 1  # the orphan goes with the next commit


def test_a_reset_during_a_turn_wins_over_its_session_write(lanes: Lanes, tmp_path: Path) -> None:
    """reset_session while a turn runs: the turn still commits, its session write does not."""
    files = SessionFiles(tmp_path, "ava")
    fence = _start(lanes)
    base = lanes.session_pointer("ava")
    assert lanes.reset_session("ava") == 1
    name = files.write(_state(1, "x"), f"f{fence}")
    done = lanes.finish("ava", fence, status="done", text="ok", session=SessionCommit(base, name))
    assert done.session == "conflict"
    assert lanes.session_pointer("ava") == Pointer(None, 1)
    assert lanes.status("ava")["last_status"] == "done"


def test_finish_without_a_session_write_leaves_the_pointer(lanes: Lanes) -> None:
    """A silent beat commits its turn with no session write: pointer and epoch unchanged."""
    fence = _start(lanes)
    assert lanes.finish("ava", fence, status="done", text="HEARTBEAT_OK").session == "unchanged"
    assert lanes.session_pointer("ava") == Pointer(None, 0)

"""The surfaced-beats stream, read side (written by finish.lua when a turn commits)."""

from __future__ import annotations

import threading

import pytest
import redis

from tests.support.lanes import make_lanes
from workers.fleet.beats import Beat, Beats
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.persona.clock import VirtualClock


@pytest.fixture
def lanes(redis_client: redis.Redis, key_prefix: str) -> Lanes:
    return make_lanes(redis_client, key_prefix, clock=VirtualClock(start=1_700_000_000.0))


@pytest.fixture
def beats(redis_client: redis.Redis, key_prefix: str) -> Beats:
    return Beats(redis_client, Keys(key_prefix))


def _surface(lanes: Lanes, lane: str, text: str) -> str:
    """Run one heartbeat turn on ``lane`` that surfaces ``text``; return its turn id."""
    tick = lanes.tick(lane, kind="heartbeat")
    assert tick.turn_id is not None
    started = lanes.start(lane, tick.turn_id, "w")
    lanes.finish(
        lane, started.fence, status="done", text=text, beat={"persona": lane, "text": text}
    )
    return tick.turn_id


def test_recent_returns_committed_beats_newest_last(lanes: Lanes, beats: Beats) -> None:
    """recent() parses persona, text, turn id and time, oldest first, newest last."""
    first = _surface(lanes, "ava", "one")
    second = _surface(lanes, "bob", "two")
    got = beats.recent()
    assert [(b.persona, b.text, b.turn_id) for b in got] == [
        ("ava", "one", first),
        ("bob", "two", second),
    ]
    assert got[0].time == 1_700_000_000.0
    assert got[0].id < got[1].id


def test_recent_honours_count_and_an_empty_stream(lanes: Lanes, beats: Beats) -> None:
    """count keeps the newest entries; an empty stream gives an empty list."""
    assert beats.recent() == []
    for n in range(5):
        _surface(lanes, "ava", f"b{n}")
    assert [b.text for b in beats.recent(count=2)] == ["b3", "b4"]
    assert beats.recent(count=0) == []


def test_follow_yields_only_beats_after_the_call_in_order(lanes: Lanes, beats: Beats) -> None:
    """follow('$') skips what was already there and yields new beats as they arrive."""
    _surface(lanes, "ava", "old")
    stream = beats.follow(block_ms=50)
    _surface(lanes, "ava", "new 1")
    _surface(lanes, "bob", "new 2")
    assert [next(stream).text, next(stream).text] == ["new 1", "new 2"]


def test_follow_from_an_id_and_stop(lanes: Lanes, beats: Beats) -> None:
    """follow(last_id) resumes after that entry; setting stop ends the generator."""
    _surface(lanes, "ava", "a")
    _surface(lanes, "ava", "b")
    first = beats.recent()[0]
    stop = threading.Event()
    got: list[Beat] = []
    for beat in beats.follow(first.id, block_ms=20, stop=stop):
        got.append(beat)
        stop.set()
    assert [b.text for b in got] == ["b"]


def test_a_malformed_entry_still_reads(
    redis_client: redis.Redis, key_prefix: str, beats: Beats
) -> None:
    """An entry with missing or bad fields is read with defaults, never an exception."""
    redis_client.xadd(Keys(key_prefix).beats, {"text": "bare", "time": "soon"})
    (beat,) = beats.recent()
    assert (beat.persona, beat.text, beat.turn_id, beat.time) == ("", "bare", "", 0.0)

"""The baton (workers/turn/baton.py): one turn at a time between waits, every wait hands it on,
and nobody ever waits for it longer than its patience."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from tests.support.rig import turn_engine
from workers.persona import waits
from workers.turn.baton import Baton


def _enabled(patience: float = 10.0) -> tuple[Baton, list[int]]:
    waited_out: list[int] = []
    baton = Baton(patience=patience, on_waited_out=lambda: waited_out.append(1))
    baton.enable()
    return baton, waited_out


def _run(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_turns_holding_the_baton_never_overlap() -> None:
    """Eight threads each hold it around a stretch of work: never two inside at once."""
    baton, waited_out = _enabled()
    inside, most = [0], [0]
    guard = threading.Lock()

    def turn() -> None:
        for _ in range(20):
            with baton.held():
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.0005)  # a stretch of "work" that lets other threads try
                with guard:
                    inside[0] -= 1

    _run([threading.Thread(target=turn) for _ in range(8)])
    assert most[0] == 1
    assert waited_out == []


def test_a_wait_hands_the_baton_to_another_turn() -> None:
    """A turn waiting inside ``released()`` (a model call) lets another turn run: the second
    turn gets in and answers the first, which could never happen if the wait kept the baton."""
    baton, waited_out = _enabled(patience=10.0)
    answered = threading.Event()
    first_waiting = threading.Event()
    got: list[bool] = []

    def first() -> None:
        with baton.held():
            with baton.released():
                first_waiting.set()
                got.append(answered.wait(timeout=5))
            assert baton.holding()  # taken back after the wait

    def second() -> None:
        first_waiting.wait(timeout=5)
        with baton.held():
            answered.set()

    _run([threading.Thread(target=first), threading.Thread(target=second)])
    assert got == [True]
    assert waited_out == []


def test_a_turn_waits_at_most_its_patience_then_runs_without_the_baton() -> None:
    """A holder stuck in a wait nobody marked: the next turn goes on after ``patience``
    seconds, counted, without the baton (its own waits then release nothing)."""
    baton, waited_out = _enabled(patience=0.2)
    stuck = threading.Event()
    release = threading.Event()
    seen: list[tuple[float, bool]] = []

    def holder() -> None:
        with baton.held():
            stuck.set()
            release.wait(timeout=10)

    def latecomer() -> None:
        stuck.wait(timeout=5)
        began = time.monotonic()
        with baton.held():
            seen.append((time.monotonic() - began, baton.holding()))
            with baton.released():  # holds nothing: nothing to give back
                pass
            assert not baton.holding()
        release.set()

    _run([threading.Thread(target=holder), threading.Thread(target=latecomer)])
    (waited, holding), = seen  # fmt: skip
    assert 0.15 <= waited < 5
    assert holding is False
    assert waited_out == [1]
    # The holder gave it back in the end: the next turn gets it at once.
    with baton.held():
        assert baton.holding()


def test_held_inside_held_holds_once() -> None:
    """A nested hold neither deadlocks nor gives the baton away when the inner one ends."""
    baton, _ = _enabled(patience=10.0)
    with baton.held():
        with baton.held():
            assert baton.holding()
        assert baton.holding()
    assert not baton.holding()


def test_disabled_baton_lets_every_turn_in_at_once() -> None:
    """Off (the default until a threads worker enables it), held() excludes nobody."""
    baton = Baton(patience=10.0)
    barrier = threading.Barrier(3, timeout=5)

    def turn() -> None:
        with baton.held():
            barrier.wait()  # all three inside together, or BrokenBarrierError

    _run([threading.Thread(target=turn) for _ in range(3)])
    assert not baton.holding()


def test_an_exception_in_a_turn_gives_the_baton_back() -> None:
    baton, waited_out = _enabled(patience=0.5)

    def failing() -> None:
        try:
            with baton.held():
                raise RuntimeError("turn failed")
        except RuntimeError:
            pass

    _run([threading.Thread(target=failing)])
    began = time.monotonic()
    with baton.held():
        assert baton.holding()
    assert time.monotonic() - began < 0.4
    assert waited_out == []


def test_a_brief_wait_comes_back_past_the_turnstile_a_long_one_through_it() -> None:
    """With turns lined up at the turnstile (held here, as by a starting turn), a turn back
    from a brief wait (a flush) takes the baton at once; back from a long wait (a model call)
    it waits its turn at the turnstile. So a turn queues behind the line once per stretch of
    work, not at every fsync."""
    baton, waited_out = _enabled(patience=10.0)
    holding, line_formed, after_flush, after_call = (threading.Event() for _ in range(4))

    def turn() -> None:
        with baton.held():
            holding.set()
            line_formed.wait(timeout=5)
            with baton.released(brief=True):
                pass
            after_flush.set()
            with baton.released():
                pass
            after_call.set()

    thread = threading.Thread(target=turn)
    thread.start()
    holding.wait(timeout=5)
    baton._turnstile.acquire()
    try:
        line_formed.set()
        assert after_flush.wait(timeout=5)
        assert not after_call.wait(timeout=0.3)  # behind the line
    finally:
        baton._turnstile.release()
    assert after_call.wait(timeout=5)
    thread.join(timeout=5)
    assert waited_out == []


def test_a_turn_back_from_a_long_wait_queues_behind_turns_already_waiting() -> None:
    """Back from a model call (not brief), a turn takes its place at the end of the line."""
    baton, waited_out = _enabled(patience=10.0)
    order: list[str] = []
    calling, answered, holder_in, holder_may_leave = (threading.Event() for _ in range(4))

    def caller() -> None:
        with baton.held():
            with baton.released():
                calling.set()
                answered.wait(timeout=5)
            order.append("caller")

    def holder() -> None:
        calling.wait(timeout=5)
        with baton.held():
            holder_in.set()
            holder_may_leave.wait(timeout=5)
            order.append("holder")

    def starting() -> None:
        holder_in.wait(timeout=5)
        with baton.held():
            order.append("starting")

    threads = [threading.Thread(target=f) for f in (caller, holder, starting)]
    for thread in threads:
        thread.start()
    holder_in.wait(timeout=5)
    time.sleep(0.1)
    answered.set()
    time.sleep(0.1)
    holder_may_leave.set()
    for thread in threads:
        thread.join(timeout=10)
    assert order == ["holder", "starting", "caller"]
    assert waited_out == []


def test_publishing_a_follow_up_turn_gives_the_baton_up(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """A follow-up turn goes out through Celery's own broker connection (which retries a lost
    one for seconds), not the fleet's clients: the publish is a wait of its own."""
    with turn_engine(redis_url, key_prefix, tmp_path, {}, gate_limit=0) as engine:
        baton = engine.executor.baton
        baton.enable()
        waits.set_wait_hook(baton.released)
        seen: list[bool] = []
        recorder = engine.published

        def publish(lane: str, turn_id: str, kind: str) -> None:
            seen.append(baton.holding())
            recorder.sent.append((lane, turn_id, kind))

        engine.fleet.publisher = SimpleNamespace(publish=publish)
        try:
            with baton.held():
                engine.executor.endings.follow_up("ava", "t1", "interactive")
                assert baton.holding()
        finally:
            waits.set_wait_hook(None)
        assert seen == [False]
        assert recorder.sent == [("ava", "t1", "interactive")]


def test_a_turn_knows_how_long_it_waited_for_the_baton() -> None:
    """What a turn waited in all (its share of queueing for the CPU: turn.end's
    ``baton_wait``); none when the baton is off."""
    assert Baton().waited() is None
    baton, _ = _enabled(patience=10.0)
    holding, waited = threading.Event(), []

    def holder() -> None:
        with baton.held():
            holding.set()
            time.sleep(0.2)

    def turn() -> None:
        holding.wait(timeout=5)
        with baton.held():
            with baton.released(brief=True):
                pass
            waited.append(baton.waited())

    _run([threading.Thread(target=holder), threading.Thread(target=turn)])
    (seconds,) = waited
    assert seconds is not None
    assert 0.1 <= seconds < 5
    with baton.held():  # a new turn starts from nothing
        assert (baton.waited() or 0.0) < 0.1

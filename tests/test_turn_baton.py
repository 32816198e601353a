"""The baton (workers/turn/baton.py): one turn at a time between waits, every wait hands it on,
and nobody ever waits for it longer than its patience."""

from __future__ import annotations

import threading
import time

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

"""The read watchdog: a guarded socket is shut down at its deadline, and only then."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from workers.persona.models.watchdog import Watchdog


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    with a, b:
        yield a, b


def test_a_read_blocked_past_its_deadline_is_woken_then(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """A recv with nothing coming (its own timeout 5 s) returns at the 0.3 s deadline with
    end-of-stream, and the guard says the watchdog did it."""
    reader, _ = pair
    reader.settimeout(5.0)
    began = time.monotonic()
    with Watchdog().guard(reader, began + 0.3) as guard:
        assert reader.recv(10) == b""
    assert guard is not None
    assert guard.fired
    assert 0.29 <= time.monotonic() - began < 2.0


def test_a_guard_that_ended_in_time_leaves_its_socket_alone(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """The connection goes back to the pool after a read ends: its old deadline passing
    later must not cut the next request's read on it."""
    reader, writer = pair
    watchdog = Watchdog()
    with watchdog.guard(reader, time.monotonic() + 0.2) as guard:
        writer.sendall(b"answer")
        assert reader.recv(10) == b"answer"
    time.sleep(0.4)
    writer.sendall(b"next")
    assert reader.recv(10) == b"next"
    assert guard is not None
    assert not guard.fired


def test_a_nearer_deadline_added_later_is_kept_on_time(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """With a far deadline already waited on, a new near one still fires at its own time
    (the watchdog's thread is woken for it), and the far one is untouched."""
    far_reader, _ = pair
    near_reader, near_writer = socket.socketpair()
    watchdog = Watchdog()
    with near_reader, near_writer, watchdog.guard(far_reader, time.monotonic() + 30) as far:
        time.sleep(0.05)  # the thread is waiting on the far deadline
        near_reader.settimeout(5.0)
        began = time.monotonic()
        with watchdog.guard(near_reader, began + 0.2) as near:
            assert near_reader.recv(10) == b""
        assert time.monotonic() - began < 2.0
        assert near is not None
        assert near.fired
        assert far is not None
        assert not far.fired


def test_no_socket_is_no_guard() -> None:
    with Watchdog().guard(None, time.monotonic()) as guard:
        assert guard is None


def test_reads_ending_in_time_do_not_pile_up_until_their_deadlines() -> None:
    """Model calls end long before their timeout: a process making thousands of them keeps
    only a bounded number of finished guards, not one per call for a timeout's worth."""
    watchdog = Watchdog()
    a, b = socket.socketpair()
    with a, b:
        far = time.monotonic() + 600
        for _ in range(1000):
            with watchdog.guard(a, far):
                pass
        assert len(watchdog._heap) <= 2 * 64 + 1  # dropped in bulk past 64 finished
        with watchdog.guard(a, time.monotonic() + 0.1) as guard:
            time.sleep(0.3)  # a due one behind them all still fires
        assert guard is not None
        assert guard.fired

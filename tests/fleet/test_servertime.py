"""ServerClock: beat's wall time is the Redis server's, whatever this host's clock says."""

from __future__ import annotations

import time

import pytest
import redis

from workers.fleet.servertime import ServerClock


def test_it_reads_the_server_time_and_ignores_a_skewed_host_clock(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the host's wall clock 5 s behind, the clock still tells Redis's TIME (within the
    round trip), and its offset reports the skew."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 5.0)
    clock = ServerClock(redis_client, refresh=0.05)

    def server_time() -> float:
        seconds, micros = redis_client.time()
        return float(seconds + micros / 1e6)

    # Bracketed by two TIME calls, the reading is exact up to round trips, which a loaded
    # machine stretches to a good part of a second: the bound is a second, well below the 5 s
    # skew a host-clock reading would show.
    for _ in range(3):
        before = server_time()
        reading = clock.time()
        after = server_time()
        assert before - 1.0 < reading < after + 1.0
        time.sleep(0.06)
    assert clock.offset() == pytest.approx(5.0, abs=1.0)


def test_between_refreshes_it_advances_with_the_monotonic_clock(
    redis_client: redis.Redis,
) -> None:
    """One TIME call per refresh; in between, time still moves forward, never back."""
    clock = ServerClock(redis_client, refresh=60.0)
    first = clock.time()
    time.sleep(0.05)
    second = clock.time()
    assert 0.04 < second - first < 0.5

"""workers/logs.py: JSON lines with context bound per task, and monotonic-safe timestamps."""

from __future__ import annotations

import json
import time

import pytest
import structlog

from workers.logs import Throttle, bind_task, configure_logging, monotonic_wall_time


@pytest.fixture(autouse=True)
def _restore_structlog() -> object:
    saved = structlog.get_config()
    yield None
    structlog.contextvars.clear_contextvars()
    structlog.configure(**saved)


def test_json_lines_carry_the_bound_task_context(capsys: pytest.CaptureFixture[str]) -> None:
    """A task's ids are on every line; the next task's bind clears the previous ones."""
    configure_logging("json", "INFO", force=True)
    log = structlog.get_logger("soulfleet.test")
    bind_task(task_id="t1", lane="ava", turn_id="u1")
    log.info("turn.start", fence=3)
    bind_task(task_id="t2", lane="bob", turn_id=None)
    log.info("turn.start", fence=1)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    first, second = lines[-2], lines[-1]
    assert first["event"] == "turn.start"
    bound = (first["task_id"], first["lane"], first["turn_id"], first["fence"])
    assert bound == ("t1", "ava", "u1", 3)
    assert (second["task_id"], second["lane"]) == ("t2", "bob")
    assert "turn_id" not in second
    assert first["ts"] <= second["ts"]
    assert first["level"] == "info"
    assert first["timestamp"].endswith("Z")


def test_monotonic_wall_time_tracks_the_clock_and_never_goes_back() -> None:
    """Within a process it follows wall time closely and is non-decreasing."""
    readings = [monotonic_wall_time() for _ in range(1000)]
    assert readings == sorted(readings)
    assert abs(monotonic_wall_time() - time.time()) < 5


def test_a_throttle_lets_one_line_a_period_through_and_counts_the_rest() -> None:
    """The first warning about a key is logged, repeats within the period are held back and
    counted, the next one after it says how many were; other keys are not held back."""
    now = [100.0]
    throttle = Throttle(every=60.0, clock=lambda: now[0])
    assert throttle.allow("ava") == 0
    assert [throttle.allow("ava") for _ in range(5)] == [None] * 5
    assert throttle.allow("bob") == 0
    now[0] += 60.0
    assert throttle.allow("ava") == 5
    assert throttle.allow("ava") is None


def test_a_throttle_forgets_its_oldest_keys_past_its_bound() -> None:
    """A throttle holds at most MAX_KEYS keys; the oldest is forgotten (and logs again)."""
    throttle = Throttle(every=60.0, clock=lambda: 0.0)
    throttle.MAX_KEYS = 3
    for key in "abc":
        assert throttle.allow(key) == 0
    assert throttle.allow("d") == 0  # forgets "a"
    assert throttle.allow("a") == 0
    assert throttle.allow("c") is None

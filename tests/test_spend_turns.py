"""Spend at turn time: the model a turn pays for, what it is charged, and the turns refused.

The executor runs in-process against a real Redis and a real local HTTP server speaking the
OpenAI wire protocol (tests/support/providers.py), so "the server saw model X" and "Redis
holds the tokens the server reported" are checked end to end, not against a stub.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.fleet import openai_env
from tests.support.providers import FakeProvider, error_reply, openai_completion
from tests.support.rig import Recorder, TurnRig, turn_engine, write_persona
from workers.fleet import Fleet
from workers.fleet.errors import BudgetStopped, RedisUnavailable
from workers.local.redis_server import RedisServer
from workers.persona.clock import VirtualClock
from workers.persona.compaction import SUMMARY_INSTRUCTIONS
from workers.persona.inbox import InboxItem
from workers.persona.messages import Usage
from workers.turn import TurnExecutor

# The next 12:00 UTC: the day boundary is 12 h away, and the virtual clock runs ahead of the
# file system's, so files written during a test look older than any pass (tests date a new
# write explicitly with _touch_after).
NOON = (time.time() // 86400 + 1) * 86400 + 12 * 3600
TOMORROW = datetime.fromtimestamp(NOON + 86400, UTC).strftime("%Y-%m-%d")


@dataclass
class Rig(TurnRig):
    server: FakeProvider
    clock: VirtualClock

    def persona(self, name: str, toml: str = "", **files: str) -> Path:
        return write_persona(
            self.root, name, "openai:talk", toml, soul=f"You are {name}.\n", **files
        )

    def models_seen(self) -> list[str]:
        return [body["model"] for body in self.server.bodies]


@contextmanager
def make_rig(
    redis_url: str, key_prefix: str, root: Path, server: FakeProvider, **env: str
) -> Iterator[Rig]:
    clock = VirtualClock(NOON)
    settings = {**openai_env(server), **env}
    with turn_engine(redis_url, key_prefix, root, settings, gate_limit=0, clock=clock) as engine:
        yield Rig(*engine, root, server, clock)


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider("openai", text="HEARTBEAT_OK") as provider:
        yield provider


@pytest.fixture
def rig(
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    server: FakeProvider,
) -> Iterator[Rig]:
    with make_rig(redis_url, key_prefix, tmp_path, server) as made:
        yield made


KINDS_TOML = """
[heartbeat]
every = "30m"
model = "openai:beat"
[dream]
every = "24h"
model = "openai:dream"
"""


def test_each_kind_of_turn_goes_to_its_own_model(rig: Rig) -> None:
    """A conversation goes to `model`, a heartbeat to `heartbeat.model`, a dream to
    `dream.model`: the server sees the three names in that order."""
    rig.persona("ava", KINDS_TOML, HEARTBEAT_md="- check the plants\n")
    rig.fleet.post("ava", "hello")
    rig.run_all()
    rig.fleet.tick("ava")
    rig.run_all()
    rig.fleet.dream("ava")
    rig.run_all()
    assert rig.models_seen() == ["talk", "beat", "dream"]


def test_fleet_defaults_apply_where_the_persona_names_no_model_for_the_kind(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path, server: FakeProvider
) -> None:
    """SOULFLEET_HEARTBEAT_MODEL / SOULFLEET_DREAM_MODEL are used when persona.toml has no
    heartbeat.model / dream.model; a conversation still uses the persona's model."""
    with make_rig(
        redis_url,
        key_prefix,
        tmp_path,
        server,
        SOULFLEET_HEARTBEAT_MODEL="openai:cheap-beat",
        SOULFLEET_DREAM_MODEL="openai:cheap-dream",
    ) as rig:
        rig.persona("ava", '[heartbeat]\nevery = "1h"\n[dream]\nevery = "1d"\n')
        rig.persona("bob", KINDS_TOML)
        for name in ("ava", "bob"):
            rig.fleet.tick(name)
            rig.run_all()
            rig.fleet.dream(name)
            rig.run_all()
        rig.fleet.post("ava", "hi")
        rig.run_all()
        assert rig.models_seen() == ["cheap-beat", "cheap-dream", "beat", "dream", "talk"]


def test_usage_in_redis_is_what_the_server_reported_per_model_and_kind(rig: Rig) -> None:
    """Each answered call adds the provider's numbers to the persona's day: input, output,
    cached input and calls, per model and per turn kind; the top-K ranks the persona."""
    rig.persona("ava", KINDS_TOML, HEARTBEAT_md="- check the plants\n")
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": "talk",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 60},
        },
    }
    rig.server.enqueue(body)
    rig.fleet.post("ava", "hello")
    rig.run_all()
    rig.fleet.tick("ava")  # the server's default answer: 11 in / 7 out
    rig.run_all()
    [day] = rig.fleet.usage("ava")
    assert (day["tokens"], day["input"], day["output"], day["cached"], day["calls"]) == (
        123,
        111,
        12,
        60,
        2,
    )
    assert day["models"]["openai:talk"] == {
        "tokens": 105,
        "input": 100,
        "output": 5,
        "cached": 60,
        "calls": 1,
    }
    assert day["kinds"] == {
        "interactive": {"calls": 1, "tokens": 105},
        "heartbeat": {"calls": 1, "tokens": 18},
    }
    assert rig.fleet.ledger.top(day["day"], 5) == [("ava", 123)]


def test_a_retried_usage_write_counts_once(rig: Rig) -> None:
    """The same call id written twice (a client retrying after a lost reply) is counted once."""
    ledger = rig.fleet.ledger
    usage = Usage(10, 2)
    args = {"persona": "ava", "day": "2026-03-10", "model": "openai:m", "kind": "heartbeat"}
    assert ledger.record(call_id="ava:t1:1:1", usage=usage, **args) == 12
    assert ledger.record(call_id="ava:t1:1:1", usage=usage, **args) == -1
    assert ledger.record(call_id="ava:t1:1:2", usage=usage, **args) == 24
    assert ledger.spent("ava", "2026-03-10") == 24


def test_usage_keys_expire_after_the_retention(rig: Rig, redis_client: redis.Redis) -> None:
    """A day's usage hash and top-K zset carry a TTL of SOULFLEET_USAGE_DAYS (+1 day)."""
    rig.fleet.ledger.record(
        persona="ava", day="2026-03-10", call_id="c", model="m", kind="dream", usage=Usage(1, 1)
    )
    days = rig.fleet.settings.usage_days
    for key in (rig.fleet.keys.usage("2026-03-10", "ava"), rig.fleet.keys.usage_top("2026-03-10")):
        ttl = int(redis_client.pttl(key))
        assert days * 86400_000 < ttl <= (days + 1) * 86400_000


BUDGET_TOML = """
[heartbeat]
every = "30m"
[budget]
daily_tokens = 30
"""


def test_over_budget_skips_background_turns_but_not_conversations(rig: Rig) -> None:
    """skip_background: once today's tokens reach daily_tokens, heartbeat turns end without a
    model call (status skipped) while conversations still run; the next day it beats again."""
    rig.persona("ava", BUDGET_TOML, HEARTBEAT_md="- water the plants\n")
    for _ in range(2):  # 2 x 18 tokens = 36 >= 30
        rig.fleet.post("ava", "hello")
        assert rig.run_all() == ["done"]
    calls = len(rig.server.requests)
    rig.fleet.tick("ava")
    assert rig.run_all() == ["skipped"]
    assert len(rig.server.requests) == calls
    rig.fleet.post("ava", "still there?")
    assert rig.run_all() == ["done"]
    assert len(rig.server.requests) == calls + 1
    rig.clock.advance(12 * 3600)  # past midnight UTC: a new day, a fresh budget
    rig.fleet.tick("ava")
    assert rig.run_all() == ["done"]
    assert len(rig.server.requests) == calls + 2


def test_a_heartbeat_turn_starting_outside_active_hours_is_skipped(rig: Rig) -> None:
    """A heartbeat turn queued (here by a direct tick, as a backlog or a deferral leaves one)
    that starts outside heartbeat.active_hours ends skipped without a model call (the worker
    ran it); a post still runs; a minute from the window (worker and Redis clocks differ by
    seconds) the beat runs."""
    toml = '[heartbeat]\nevery = "30m"\nactive_hours = { start = "13:00", end = "14:00" }\n'
    rig.persona("ava", toml, HEARTBEAT_md="- water the plants\n")  # now: 12:00 UTC
    rig.fleet.tick("ava")
    assert rig.run_all() == ["skipped"]
    assert rig.server.requests == []
    rig.fleet.post("ava", "hello")
    assert rig.run_all() == ["done"]
    rig.clock.advance(59 * 60 + 30)  # 12:59:30 UTC
    rig.fleet.tick("ava")
    assert rig.run_all() == ["done"]
    assert len(rig.server.requests) == 2


def test_a_post_behind_a_queued_heartbeat_is_a_conversation_not_a_skipped_beat(
    rig: Rig,
) -> None:
    """A post that arrives while a heartbeat turn is queued shares that turn: the turn drains
    it, so it is a conversation. Over a skip_background budget it was skipped as a heartbeat
    and the post dropped with it (lane idle, inbox empty, no reply, no error); under
    heartbeat.model it went to the heartbeat's model. Now it runs on the persona's model."""
    toml = BUDGET_TOML.replace('every = "30m"', 'every = "30m"\nmodel = "openai:beat"')
    rig.persona("ava", toml, HEARTBEAT_md="- water the plants\n")
    for _ in range(2):  # 2 x 18 tokens = 36 >= 30: background turns are skipped from now
        rig.fleet.post("ava", "hello")
        assert rig.run_all() == ["done"]
    rig.fleet.tick("ava")
    assert rig.fleet.status("ava")["state"] == "queued"
    rig.fleet.post("ava", "remember: the fern needs shade")
    assert rig.run_all() == ["done"]
    assert rig.models_seen()[-1] == "talk"
    last = rig.server.bodies[-1]
    assert "the fern needs shade" in str(last["messages"])
    assert rig.fleet.status("ava")["inbox_depth"] == 0


def test_stop_refuses_a_post_at_the_door_and_tells_the_sender_why(rig: Rig) -> None:
    """on_exceed = "stop": a post to an over-budget persona is refused by Fleet.post itself,
    saying the budget is used up and when it resets, so its sender still has the item (a turn
    refusing it would have dropped it); nothing is queued and no model call is made."""
    rig.persona("ava", '[budget]\ndaily_tokens = 10\non_exceed = "stop"\n')
    rig.fleet.post("ava", "hello")
    assert rig.run_all() == ["done"]
    calls = len(rig.server.requests)
    with pytest.raises(BudgetStopped) as refused:
        rig.fleet.post("ava", "again", reply=True)
    assert "used its daily token budget (18 of 10 tokens" in str(refused.value)
    assert f"{TOMORROW}T00:00+00:00" in str(refused.value)
    assert "NOT accepted" in str(refused.value)
    assert rig.fleet.status("ava")["inbox_depth"] == 0
    assert rig.run_all() == []
    assert len(rig.server.requests) == calls


def test_an_item_accepted_before_the_budget_ran_out_is_refused_with_the_reason(rig: Rig) -> None:
    """A post that raced the spend (accepted while the budget lasted, its turn started after):
    the turn refuses it without a model call and whoever waits for a reply gets the reason."""
    rig.persona("ava", '[budget]\ndaily_tokens = 10\non_exceed = "stop"\n')
    rig.fleet.post("ava", "hello")
    assert rig.run_all() == ["done"]
    calls = len(rig.server.requests)
    item = InboxItem.create("again", "external", "api", reply=True)
    outcome = rig.fleet.lanes.post("ava", item, wake=True)  # what Fleet.post did a moment ago
    assert outcome.turn_id is not None
    assert outcome.turn_kind is not None
    rig.fleet.publisher.publish("ava", outcome.turn_id, outcome.turn_kind)
    assert rig.run_all() == ["refused"]
    assert len(rig.server.requests) == calls
    reply = rig.fleet.client.lrange(rig.fleet.keys.reply(item.id), 0, -1)
    assert len(reply) == 1
    assert "daily token budget used up (18 of 10 tokens" in str(reply[0])
    assert f"{TOMORROW}T00:00+00:00" in str(reply[0])


def test_fleet_daily_tokens_is_the_default_budget(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path, server: FakeProvider
) -> None:
    """SOULFLEET_DAILY_TOKENS budgets every persona without a [budget] of its own."""
    with make_rig(redis_url, key_prefix, tmp_path, server, SOULFLEET_DAILY_TOKENS="5") as rig:
        rig.persona("ava", '[heartbeat]\nevery = "1h"\n', HEARTBEAT_md="- stretch\n")
        rig.fleet.tick("ava")
        assert rig.run_all() == ["done"]
        rig.fleet.tick("ava")
        assert rig.run_all() == ["skipped"]
        assert len(rig.server.requests) == 1


def test_a_dream_with_nothing_new_since_its_last_pass_is_skipped(rig: Rig) -> None:
    """The first pass runs; a second with nothing written since is skipped (nothing_new); a
    conversation or a note written after the pass makes the next one run."""
    home = rig.persona("ava", '[dream]\nevery = "1h"\n')
    rig.fleet.dream("ava")
    began = rig.clock.time()
    assert rig.run_all() == ["done"]
    # When the pass ended and when it began (what it could read): "<ended ms>:<began ms>".
    recorded = rig.fleet.client.hget(rig.fleet.keys.lane("ava-dreamer"), "last_pass")
    ended_ms, began_ms = (int(part) for part in str(recorded).split(":"))
    assert began_ms == int(began * 1000) <= ended_ms
    time.sleep(0.01)
    rig.clock.advance(3600)
    rig.fleet.dream("ava")
    assert rig.run_all() == ["skipped"]
    rig.clock.advance(3600)
    rig.fleet.post("ava", "I moved to Oslo")  # a conversation: a new transcript
    rig.run_all()
    _touch_after(home / "sessions" / "ava", rig.clock.time())
    rig.fleet.dream("ava")
    assert rig.run_all() == ["done"]
    rig.clock.advance(3600)
    rig.fleet.dream("ava")
    assert rig.run_all() == ["skipped"]
    rig.clock.advance(3600)
    (home / "memory").mkdir(exist_ok=True)
    (home / "memory" / "people.md").write_text("- Tom likes tea\n")
    _touch_after(home / "memory" / "people.md", rig.clock.time())
    rig.fleet.dream("ava")
    assert rig.run_all() == ["done"]
    assert rig.models_seen().count("talk") == 4  # three passes and one conversation


def test_silent_heartbeats_are_nothing_new_to_a_dream(rig: Rig) -> None:
    """A silent beat is logged in the persona's transcript for audit but adds nothing to its
    conversation: counted as new (the transcript was the source), every scheduled dream of a
    persona with a HEARTBEAT.md ran and was paid for. A conversation still is new."""
    home = rig.persona(
        "ava", '[heartbeat]\nevery = "30m"\n[dream]\nevery = "1h"\n',
        HEARTBEAT_md="- check the plants\n",
    )  # fmt: skip
    rig.fleet.post("ava", "hello")
    assert rig.run_all() == ["done"]
    rig.clock.advance(60)
    rig.fleet.dream("ava")
    assert rig.run_all() == ["done"]
    rig.clock.advance(600)
    rig.fleet.tick("ava")
    assert rig.run_all() == ["done"]  # the server answers HEARTBEAT_OK: a silent beat
    _touch_after(home / "transcripts" / "ava", rig.clock.time())  # written after the pass
    rig.clock.advance(3600)
    rig.fleet.dream("ava")
    assert rig.run_all() == ["skipped"]
    rig.fleet.post("ava", "I moved to Oslo")
    rig.run_all()
    _touch_after(home / "sessions" / "ava", rig.clock.time())
    rig.clock.advance(3600)
    rig.fleet.dream("ava")
    assert rig.run_all() == ["done"]


def _touch_after(path: Path, when: float) -> None:
    """The virtual clock runs ahead of the file system's: date the write just before ``when``
    (after the previous pass, before the one about to run)."""
    targets = [path, *path.iterdir()] if path.is_dir() else [path]
    for target in targets:
        os.utime(target, (when - 1, when - 1))


def test_a_run_to_a_stopped_persona_is_refused_with_the_reason(rig: Rig) -> None:
    """Fleet.run to a persona whose budget stops every turn raises BudgetStopped with the
    reason before anything is queued; no model call is made."""
    rig.persona("ava", '[budget]\ndaily_tokens = 0\non_exceed = "stop"\n')
    with pytest.raises(BudgetStopped, match=r"used its daily token budget \(0 of 0 tokens"):
        rig.fleet.run("ava", "hello", timeout=30)
    assert rig.published.sent == []
    assert rig.server.requests == []


def test_a_redis_restart_during_a_model_call_does_not_pay_the_answer_twice(
    tmp_path: Path,
) -> None:
    """Redis restarts (an upgrade, a failover: back in about a second, its data kept) while a
    turn's model call is in flight. The provider answered and billed the call; the turn must
    keep that answer and count it once Redis is back. The usage write after the call, sent
    once with no wait, failed: the paid answer was thrown away, the turn failed, and its retry
    paid for the same call again, while the first payment was never counted. The bill is two
    calls (a tool call, then the reply), and Redis counts exactly those two."""
    first: list[bool] = []
    redis_box: dict[str, RedisServer] = {}

    def come_back() -> None:
        time.sleep(1.0)
        port = redis_box["server"].port
        redis_box["server"] = RedisServer(tmp_path / "redis", port=port, persistent=True).start()

    def answer(body: dict[str, Any]) -> str | dict[str, Any]:
        if body["messages"][-1]["role"] == "tool":
            return "all done"
        if not first:  # the first call: Redis goes away while the provider answers
            first.append(True)
            process = redis_box["server"].process
            assert process is not None
            process.kill()
            process.wait(10)
            threading.Thread(target=come_back, daemon=True).start()
        return openai_completion(None, [("call_1", "slow", {"seconds": 3})], model="talk")

    redis_box["server"] = RedisServer(tmp_path / "redis", persistent=True).start()
    root = tmp_path / "personas"
    root.mkdir()
    try:
        with FakeProvider("openai", answer=answer) as server:
            env = {**openai_env(server), "SOULFLEET_LEASE_TTL": "10"}
            url = redis_box["server"].url
            with turn_engine(url, "blip:", root, env, gate_limit=4) as (fleet, executor, sent):
                write_persona(root, "ava", "openai:talk", SLOW_TOOL, soul="You are ava.\n")
                fleet.post("ava", "hello")
                _run_until_done(fleet, executor, sent, "ava", timeout=60)
                billed = server.served
                [day] = fleet.usage("ava")
    finally:
        redis_box["server"].stop()
    assert len(billed) == 2, f"{len(billed)} calls billed for a turn of two"
    assert day["calls"] == len(billed)
    assert day["tokens"] == sum(call.input_tokens + call.output_tokens for call in billed)


SLOW_TOOL = '[[tools.python]]\nref = "tests.support.python_tools:slow"\n'


def _run_until_done(
    fleet: Fleet, executor: TurnExecutor, sent: Recorder, persona: str, *, timeout: float
) -> None:
    """Run published turns until the persona's lane is idle after a done turn. A turn that
    escapes with an error is what a worker's task would do (it fails, the lane keeps its lease);
    beat's reaper (``Fleet.reap``) then hands the lane on once the lease lapses."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sent.sent:
            lane, turn_id, _ = sent.sent.pop(0)
            with contextlib.suppress(RedisUnavailable):
                executor.execute(lane, turn_id)
            continue
        try:
            fleet.reap()
            status = fleet.status(persona)
        except RedisUnavailable:
            status = {}
        if status.get("state") == "idle" and status.get("last_status") == "done":
            return
        time.sleep(0.2)
    raise AssertionError(f"{persona}'s turn did not end done within {timeout}s")


def test_the_fleet_wide_usage_lists_a_persona_counting_in_its_own_time_zone(rig: Rig) -> None:
    """A persona whose budget counts in Asia/Tokyo spends at 18:00 UTC (03:00 the next day in
    Tokyo): its tokens go to its Tokyo day, which ``soulfleet status`` and ``usage NAME`` show.
    The fleet-wide listing (``soulfleet usage``, who spent what today) read only UTC's day,
    so it left the persona out (up to 9 hours a day for Tokyo, whatever it spent), and showed
    its previous Tokyo day as today."""
    rig.persona("kenji", '[budget]\ntimezone = "Asia/Tokyo"\n')
    rig.persona("ava")
    rig.clock.advance(6 * 3600)  # 18:00 UTC, 03:00 tomorrow in Tokyo
    for name in ("kenji", "ava"):
        rig.fleet.post(name, "hello")
        assert rig.run_all() == ["done"]
    assert rig.fleet.status("kenji")["tokens_today"] == 18
    [own] = rig.fleet.usage("kenji")
    assert own["tokens"] == 18
    listed = {row["persona"]: row for row in rig.fleet.usage()}
    assert set(listed) == {"ava", "kenji"}
    assert listed["kenji"]["day"] == own["day"]
    assert listed["kenji"]["tokens"] == 18


def test_a_retried_turn_does_not_pay_again_for_the_summary_its_first_attempt_bought(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path, server: FakeProvider
) -> None:
    """A turn over ``session.max_tokens`` first pays for a summary of the older conversation
    (input: all of it), then its own call fails (HTTP 500) and the turn is retried. The retry
    started from the uncompacted session again and paid for a second summary of the same
    history, and each further retry (a provider outage: one per backoff step for
    SOULFLEET_RETRY_FOR) another: nothing paid twice does not hold for the costliest call a
    turn makes. The summary bought once is used by the retry."""
    with make_rig(redis_url, key_prefix, tmp_path, server, SOULFLEET_RETRY_BASE="10s",
                  SOULFLEET_RETRY_MAX="20s") as rig:  # fmt: skip
        rig.persona("ava", "[session]\nmax_tokens = 200\nkeep_tail = 50\n")
        rig.fleet.post("ava", "remember this: " + "the fern needs shade. " * 40)
        rig.fleet.post("ava", "hi")
        assert rig.run_all() == ["done"]
        rig.fleet.post("ava", "and the cactus?")
        assert rig.run_all() == ["done"]
        server.enqueue(
            openai_completion("ava keeps a fern that needs shade", model="talk"),
            error_reply("openai", 500, "overloaded"),
        )
        rig.fleet.post("ava", "what about the orchid?")
        assert rig.run_all() == ["error"]
        rig.clock.advance(21.0)
        assert rig.fleet.recover()
        assert rig.run_all() == ["done"]
        summaries = [
            body for body in server.bodies
            if str(body["messages"][0]["content"]).startswith(SUMMARY_INSTRUCTIONS[:40])
        ]  # fmt: skip
        assert rig.fleet.session("ava")["compactions"] == 1
        assert len(summaries) == 1, f"{len(summaries)} summaries paid for one compaction"


def test_a_turn_budget_below_the_session_limit_compacts_instead_of_muting_the_persona(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """SOULFLEET_TURN_MAX_TOKENS (3,000 here) below session.max_tokens (60,000 by default):
    compaction waited for 60,000, so once the session passed the turn's budget every turn
    ended before its model call ("the input alone is over the turn's token budget"), for
    good. The session is compacted at half the turn's budget instead: every turn answers."""
    with FakeProvider("openai", text="ok " * 50) as server, make_rig(
        redis_url, key_prefix, tmp_path, server, SOULFLEET_TURN_MAX_TOKENS="3000"
    ) as rig:  # fmt: skip
        rig.persona("ava")
        for n in range(15):
            rig.fleet.post("ava", f"message {n}: " + "words " * 150)
            assert rig.run_all() == ["done"], rig.fleet.status("ava").get("last_note")
        session = rig.fleet.session("ava")
        assert session["compactions"] >= 1
        assert session["estimated_tokens"] < 3000


@pytest.mark.parametrize("memory_words", [900, 1300])
def test_a_large_soul_under_the_turn_budget_still_compacts_and_answers(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path, memory_words: int
) -> None:
    """A soul over half the turn's budget (but under it, so the session is continued): the
    compaction threshold (half the budget) is below the soul alone, so compaction can never
    bring the session under it, and the session grows until every turn ends before its call."""
    with FakeProvider("openai", text="ok " * 50) as server, make_rig(
        redis_url, key_prefix, tmp_path, server, SOULFLEET_TURN_MAX_TOKENS="3000"
    ) as rig:  # fmt: skip
        rig.persona("ava", MEMORY_md="- " + "fact " * memory_words + "\n")
        for n in range(15):
            rig.fleet.post("ava", f"message {n}: " + "words " * 150)
            assert rig.run_all() == ["done"], (n, rig.fleet.status("ava").get("last_note"))


def test_a_dream_pass_that_made_no_call_does_not_count_as_the_last_pass(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A pass whose input alone was over the token budget (a huge DREAM.md) made no call and
    read nothing, yet it moved the last-pass mark: once DREAM.md was shrunk, as its note says,
    every later pass was skipped "nothing new" and the conversation before it was never
    dreamt over. The next pass runs."""
    with FakeProvider("openai", text="ok") as server, make_rig(
        redis_url, key_prefix, tmp_path, server, SOULFLEET_TURN_MAX_TOKENS="3000"
    ) as rig:  # fmt: skip
        home = rig.persona("ava", '[dream]\nevery = "1h"\n', DREAM_md="dream hard. " * 3000)
        rig.fleet.post("ava", "I moved to Oslo")
        assert rig.run_all() == ["done"]
        rig.clock.advance(60)
        rig.fleet.dream("ava")
        assert rig.run_all() == ["incomplete"]
        (home / "DREAM.md").write_text("Fold the day into memory.\n")
        rig.clock.advance(60)
        rig.fleet.dream("ava")
        assert rig.run_all() == ["done"]

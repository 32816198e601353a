"""Sessions through the real fleet (issue 11 "Must show"): real Redis, real `celery worker`
processes, and the local OpenAI-compatible test server standing in for the paid model. The
server answers from the conversation it is sent, so remembering shows in its answers, and it
records every request, so what reached the "provider" is checked byte for byte.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from tests.support.providers import FakeProvider, Reply, openai_completion
from workers.persona.transcripts import FileTranscripts

pytestmark = pytest.mark.integration

MODEL = 'model = "openai:fake"\n'


class Recall:
    """A model that answers from the history it is sent: the latest "my name is X"."""

    def __init__(self) -> None:
        self.slow_once: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, body: Any) -> Reply:
        messages = body["messages"]
        users = [m["content"] for m in messages if m["role"] == "user"]
        last = users[-1]
        names = [n for text in users for n in re.findall(r"my name is (\w+)", text)]
        delay = 0.0
        with self.lock:
            for word in list(self.slow_once):
                if word in last:
                    self.slow_once.discard(word)
                    delay = 120.0  # the worker is SIGKILLed long before this answer
        if "what is my name" in last:
            text = names[-1] if names else "I don't know"
        elif "Heartbeat" in last:
            text = "HEARTBEAT_OK"
        else:
            text = "noted"
        return Reply(body=openai_completion(text), delay=delay)


@pytest.fixture
def recall() -> Recall:
    return Recall()


@pytest.fixture
def provider(harness: Harness, recall: Recall) -> Iterator[FakeProvider]:
    with FakeProvider("openai", respond=recall) as server:
        harness.configure(OPENAI_BASE_URL=server.base_url)
        yield server


def _user_texts(body: Any) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def test_a_second_run_sees_the_first_exchange_and_answers_bob(
    harness: Harness, provider: FakeProvider
) -> None:
    """Two Fleet.run calls through a real worker: the second request carries the first
    exchange, and the model answering from history says "Bob"."""
    harness.persona("nora", toml=MODEL)
    harness.worker()
    first = harness.fleet.run("nora", "my name is Bob", timeout=60)
    second = harness.fleet.run("nora", "what is my name?", timeout=60)
    assert second.text == "Bob"
    body = provider.bodies[1]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert "my name is Bob" in body["messages"][1]["content"]
    assert body["messages"][2]["content"] == first.text
    session = harness.fleet.session("nora")
    assert (session["turns"], session["messages"], session["ends"]) == (2, 4, None)
    assert session["estimated_tokens"] > 0
    assert session["compactions"] == 0
    end = harness.events("turn.end", lane="nora")[-1]
    assert end["session"] == session["id"]
    assert end["session_write"] == "committed"
    assert "cached_input_tokens" in end
    assert "cache_write_input_tokens" in end


def test_the_soul_is_frozen_until_the_session_is_reset(
    harness: Harness, provider: FakeProvider
) -> None:
    """MEMORY.md edited between two turns of one session: byte-identical system prompts;
    after reset_session the next request carries the new file, and no history."""
    home = harness.persona("nora", toml=MODEL, files={"MEMORY.md": "- Bob likes tea."})
    harness.worker()
    harness.fleet.run("nora", "hello", timeout=60)
    (home / "MEMORY.md").write_text("- Bob moved to Oslo.", encoding="utf-8")
    harness.fleet.run("nora", "hello again", timeout=60)
    systems = [json.dumps(body["messages"][0]).encode() for body in provider.bodies]
    assert systems[0] == systems[1]
    assert "Bob likes tea." in provider.bodies[1]["messages"][0]["content"]
    before = harness.fleet.session("nora")["id"]

    harness.fleet.reset_session("nora")
    assert harness.fleet.session("nora")["ends"] == "reset"
    harness.fleet.run("nora", "and now?", timeout=60)
    third = provider.bodies[2]["messages"]
    assert "Bob moved to Oslo." in third[0]["content"]
    assert [m["role"] for m in third] == ["system", "user"]
    after = harness.fleet.session("nora")
    assert after["id"] != before
    assert after["turns"] == 1

    harness.fleet.run("nora", "fresh again", new_session=True, timeout=60)
    assert [m["role"] for m in provider.bodies[3]["messages"]] == ["system", "user"]


def test_fifty_silent_heartbeats_add_nothing_to_the_session(
    harness: Harness, provider: FakeProvider
) -> None:
    """50 heartbeats answered HEARTBEAT_OK between two user turns add 0 messages: the second
    user turn's request holds only the first exchange; the beats are in the transcript."""
    home = harness.persona("nora", toml=MODEL, files={"HEARTBEAT.md": "- check the plants"})
    harness.worker()
    harness.fleet.run("nora", "my name is Bob", timeout=60)
    before = harness.fleet.session("nora")

    def beat_done(count: int) -> bool:
        ended = len(harness.events("turn.end", lane="nora")) >= count
        return ended and harness.fleet.status("nora")["state"] == "idle"

    for n in range(50):
        assert harness.fleet.tick("nora").outcome == "queued"
        wait_until(partial(beat_done, n + 2), timeout=60, interval=0.05, what=f"beat {n + 1}")
    after = harness.fleet.session("nora")
    assert after["messages"] == before["messages"] == 2
    assert after["turns"] == before["turns"] == 1
    assert after["id"] == before["id"]
    assert harness.fleet.run("nora", "what is my name?", timeout=60).text == "Bob"
    last = provider.bodies[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user"]
    assert not any("Heartbeat" in m["content"] for m in last if m["role"] == "user")
    audit = FileTranscripts(home).messages(before["id"])
    assert sum(1 for r in audit if r.message.content == "HEARTBEAT_OK") == 50


def test_a_sigkilled_turn_retried_is_in_the_session_exactly_once(
    harness: Harness, provider: FakeProvider, recall: Recall
) -> None:
    """A worker SIGKILLed in the middle of a turn (its model call in flight), then the turn
    retried on another worker: the session holds that turn exactly once."""
    harness.configure(SOULFLEET_LEASE_TTL="2")
    harness.persona("nora", toml=MODEL)
    w1 = harness.worker("w1")
    harness.fleet.run("nora", "my name is Bob", timeout=60)
    recall.slow_once.add("my name is Carl")
    harness.fleet.post("nora", "my name is Carl", wake=True)
    wait_until(lambda: provider.in_flight == 1, timeout=30, what="the turn's model call")
    w2 = harness.worker("w2")
    w1.kill()

    def retried() -> list[dict[str, Any]]:
        harness.fleet.reap()  # what beat's reaper does every few seconds
        return [e for e in w2.events("turn.end") if e.get("status") == "done"]

    wait_until(retried, timeout=60, interval=0.25, what="the retry on w2")
    assert harness.fleet.run("nora", "what is my name?", timeout=60).text == "Carl"
    users = _user_texts(provider.bodies[-1])
    assert sum("my name is Carl" in text for text in users) == 1
    assert sum("my name is Bob" in text for text in users) == 1
    assert harness.fleet.session("nora")["turns"] == 3
    assert not [e for e in w1.events("turn.end") if e.get("lane") == "nora"][1:]


def test_zero_idle_reset_is_one_conversation_per_turn(
    harness: Harness, provider: FakeProvider
) -> None:
    """idle_reset = "0s" in persona.toml: every fleet turn starts a new session (today's
    behaviour): no history is sent and each turn has its own transcript conversation."""
    home = harness.persona("nora", toml=MODEL + '[session]\nidle_reset = "0s"\n')
    harness.worker()
    harness.fleet.run("nora", "my name is Bob", timeout=60)
    time.sleep(0.01)
    assert harness.fleet.run("nora", "what is my name?", timeout=60).text == "I don't know"
    assert [m["role"] for m in provider.bodies[1]["messages"]] == ["system", "user"]
    assert len(FileTranscripts(home).conversations()) == 2

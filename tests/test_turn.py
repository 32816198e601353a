"""workers/turn.py: one fleet turn from start to commit, in-process on a real Redis.

The Celery task is a thin edge over :class:`TurnExecutor`; these tests drive the executor
directly (a recording publisher stands in for the broker, which the integration tests cover),
so every branch — surfaced and silent beats, the dream log, a lost lease, a broken persona —
is checked against what lands in Redis and on disk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from workers.fleet import Fleet
from workers.fleet.gate import Gate
from workers.fleet.lease import Renewer
from workers.settings import Settings
from workers.turn import TurnExecutor


@dataclass
class Recorder:
    sent: list[tuple[str, str, str]] = field(default_factory=list)

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        self.sent.append((lane, turn_id, kind))

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None:
        self.sent.extend(turns)


@dataclass
class Rig:
    fleet: Fleet
    executor: TurnExecutor
    published: Recorder
    root: Path

    def persona(self, name: str, rules: str, toml: str = "", **files: str) -> Path:
        home = self.root / name
        home.mkdir()
        (home / "rules.toml").write_text(rules)
        (home / "persona.toml").write_text(f'model = "scripted:rules.toml"\n{toml}')
        for filename, text in files.items():
            (home / filename.replace("_", ".")).write_text(text)
        return home

    def run_next(self) -> str:
        """Run the most recently published turn; return its outcome."""
        lane, turn_id, _ = self.published.sent.pop()
        return self.executor.execute(lane, turn_id).outcome


@pytest.fixture
def rig(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[Rig]:
    settings = Settings.from_env(
        {
            "REDIS_URL": redis_url,
            "SOULFLEET_KEY_PREFIX": key_prefix,
            "SOULFLEET_PERSONAS": str(tmp_path),
            "SOULFLEET_MAX_ATTEMPTS": "2",
            "SOULFLEET_MAX_CONCURRENT_MODEL_CALLS": "1",
        }
    )
    published = Recorder()
    fleet = Fleet(settings, publisher=published)
    renewer = Renewer(fleet.lanes)
    gate = Gate(fleet.client, fleet.keys, limit=1, slot_ttl=30, renewer=renewer)
    executor = TurnExecutor(settings, fleet, renewer, gate, worker_id="test-worker")
    try:
        yield Rig(fleet, executor, published, tmp_path)
    finally:
        renewer.stop()
        fleet.client.close()


HEARTBEAT_RULES = """
[[rules]]
when = { heartbeat = true, section = "HEARTBEAT.md", section_regex = '(?m)^due: (.+)$' }
text = "Reminder: {match}"

[[rules]]
when = { heartbeat = true }
text = "HEARTBEAT_OK"
"""


def test_a_substantive_heartbeat_surfaces_and_a_silent_one_does_not(rig: Rig) -> None:
    """A due reminder lands in the beats stream with its turn id; HEARTBEAT_OK lands nowhere."""
    rig.persona("ava", HEARTBEAT_RULES, HEARTBEAT_md="due: water the plants\n")
    rig.persona("bob", HEARTBEAT_RULES, HEARTBEAT_md="nothing today\n")
    rig.fleet.tick("ava")
    assert rig.run_next() == "done"
    rig.fleet.tick("bob")
    assert rig.run_next() == "done"
    beats = rig.fleet.beats()
    assert [(b.persona, b.text) for b in beats] == [("ava", "Reminder: water the plants")]
    assert beats[0].turn_id == rig.fleet.status("ava")["last_turn"]
    assert rig.fleet.status("bob")["last_text"] == "HEARTBEAT_OK"


def test_the_scripted_model_never_waits_for_the_turn_gate(rig: Rig) -> None:
    """The gate protects a provider's rate limit: with its only slot held elsewhere, an
    offline scripted turn still runs at once."""
    rig.persona("ava", HEARTBEAT_RULES, HEARTBEAT_md="due: stretch\n")
    assert rig.executor.gate.acquire("someone-else")
    rig.fleet.tick("ava")
    assert rig.run_next() == "done"


def test_a_dream_that_did_not_log_itself_is_logged_by_the_runtime(rig: Rig) -> None:
    """A non-silent dream reply that wrote no note:log still lands in memory/log.md."""
    rules = '[[rules]]\ntext = "merged two notes about Tom"\n'
    home = rig.persona("ava", rules, '[dream]\nevery = "1h"\n')
    rig.fleet.dream("ava")
    lane, _, kind = rig.published.sent[-1]
    assert (lane, kind) == ("ava-dreamer", "dream")
    assert rig.run_next() == "done"
    log = (home / "memory" / "log.md").read_text()
    assert "merged two notes about Tom" in log
    assert rig.fleet.beats() == [], "dream replies never reach the beats feed"


def test_a_turn_that_loses_its_lease_commits_nothing(rig: Rig) -> None:
    """The lane is taken over (fence moved on) right after start and the renewer notices: the
    guard stops the turn before its first write (no transcript line), the item stays in flight
    for the new holder, and nothing is committed."""
    rules = """
[[rules]]
when = { tool_results = 0 }
calls = [{ tool = "memory", args = { action = "read" } }]

[[rules]]
text = "done"
"""
    rig.persona("ava", rules, "notes = true\n")
    rig.fleet.post("ava", "hello", wake=True)
    lane, turn_id, _ = rig.published.sent.pop()
    keys = rig.fleet.keys
    original = rig.executor.renewer.register_lease

    def steal_after_register(lane: str, fence: int) -> object:
        handle = original(lane, fence)
        rig.fleet.client.hincrby(keys.lane(lane), "fence", 1)  # the reaper's takeover
        rig.executor.renewer.renew_now()  # the renewer's next pass
        return handle

    rig.executor.renewer.register_lease = steal_after_register  # type: ignore[method-assign,assignment]
    report = rig.executor.execute(lane, turn_id)
    assert report.outcome == "lease_lost"
    status = rig.fleet.status("ava")
    assert status["state"] == "running"
    assert status["inflight_items"] == 1
    assert status["last_turn"] is None
    assert not list((rig.root / "ava").glob("transcripts/ava/*.jsonl"))


def test_a_persona_that_cannot_be_composed_fails_only_its_own_turn(rig: Rig) -> None:
    """A directory where MEMORY.md should be: an invalid persona file is a permanent failure,
    so the turn dead-letters at once (no retry published) with a reason naming the file and
    saying it was not retried; another persona is fine."""
    home = rig.persona("broken", '[[rules]]\ntext = "hi"\n')
    (home / "MEMORY.md").mkdir()
    rig.persona("fine", '[[rules]]\ntext = "hi"\n')
    rig.fleet.post("broken", "hello", wake=True)
    assert rig.run_next() == "error"
    assert rig.published.sent == []
    status = rig.fleet.status("broken")
    assert status["state"] == "dead"
    assert "MEMORY.md" in str(status["last_error"])
    assert "permanent failure, not retried" in str(status["last_error"])
    rig.fleet.post("fine", "hello", wake=True)
    assert rig.run_next() == "done"

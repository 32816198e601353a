"""A fleet of 200 personas on short schedules, against a local model server: the calls it
receives are exactly the ones the spend rules allow.

Real worker and beat processes (tests/integration/conftest.py), a real Redis and a real HTTP
server speaking the OpenAI wire protocol (tests/support/providers.py). The mix: due reminders,
blank and comment-only HEARTBEAT.md, no HEARTBEAT.md, dreamers with and without a new
conversation, idle and recently-posted personas, and personas over budget (skip_background,
with and without a conversation, and stop). The test checks, persona by persona, that the
server received exactly the calls the rules allow, that every skip is logged with its reason,
that the due reminders surface, that each kind of turn reached its own model, and that the
usage in Redis equals what the server billed.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from beat.schedule import ScheduleSpec
from tests.integration.conftest import Harness
from tests.support.fleet import soak_seconds, wait_until
from tests.support.providers import FakeProvider
from workers.fleet.errors import BudgetStopped
from workers.fleet.keys import schedule_member
from workers.persona.messages import Usage
from workers.persona.spend import usage_day

pytestmark = pytest.mark.integration

#: How long beat runs (SOULFLEET_TEST_SOAK for a longer soak; at least 16 s, so each lane has
#: a few due slots): heartbeats every 5 s and dreams every 6 s give each lane 4-6 in 24 s.
RUN_SECONDS = max(16.0, soak_seconds(24.0))
_NAME = re.compile(r"You (?:are|dream for) ([\w-]+)\.")

BEAT = '[heartbeat]\nevery = "5s"\nmodel = "openai:beat"\n'
DREAM = '[dream]\nevery = "6s"\nwindow = "1s"\nmodel = "openai:dreamer"\n'
IDLE = BEAT + 'idle_after = "1h"\nidle_every = "1d"\n'
OVER = "[budget]\ndaily_tokens = 100\n"
STOP = '[budget]\ndaily_tokens = 100\non_exceed = "stop"\n'
COMMENTS = "<!-- Write what to check here; nothing yet. -->\n"
HEADINGS = "# Heartbeat checklist\n\n## Mornings\n- \n- [ ]\n"


@dataclass(frozen=True)
class Group:
    """One kind of persona in the mix: how many, its files, and what the test does to it."""

    prefix: str
    count: int
    toml: str
    heartbeat: str | None = None
    post: bool = False
    seed_last_pass: bool = False
    idle: bool = False
    over_budget: bool = False


GROUPS = (
    Group("due", 30, BEAT, heartbeat="due: call {name}\n"),
    Group("comments", 20, BEAT, heartbeat=COMMENTS),
    Group("headings", 20, BEAT, heartbeat=HEADINGS),
    Group("nofile", 10, BEAT),
    Group("dreamnew", 25, DREAM, post=True, seed_last_pass=True),
    Group("dreamold", 25, DREAM, seed_last_pass=True),
    Group("idle", 20, IDLE, heartbeat="- check the inbox\n", idle=True),
    Group("posted", 20, IDLE, heartbeat="- check the inbox\n", post=True),
    Group("over", 10, BEAT + OVER, heartbeat="- water the plants\n", over_budget=True),
    Group("overtalk", 10, BEAT + OVER, heartbeat="- water\n", post=True, over_budget=True),
    Group("stop", 10, BEAT + STOP, heartbeat="- water\n", post=True, over_budget=True),
)


def names(group: Group) -> list[str]:
    return [f"{group.prefix}{n:03d}" for n in range(group.count)]


def persona_of(body: Any) -> str:
    system = body["messages"][0]["content"]
    found = _NAME.search(system)
    assert found, f"no persona in system prompt {system[:200]!r}"
    return found.group(1)


def answer(body: Any) -> str:
    """Due reminders surface; other heartbeats stay silent; conversations get a reply."""
    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    due = re.search(r"due: (call \S+)", system)
    if "channel: heartbeat" in user:
        return f"Reminder: {due.group(1)}" if due else "HEARTBEAT_OK"
    return "HEARTBEAT_OK" if "channel: dream" in user else "noted"


def tokens(body: Any) -> tuple[int, int]:
    """Different numbers per persona and per request, so a lost or doubled call shows."""
    return 7 + len(json.dumps(body["messages"])) % 97, 3 + len(persona_of(body)) % 5


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider("openai", delay=0.02, answer=answer, tokens=tokens) as provider:
        yield provider


def test_a_200_persona_fleet_pays_only_for_the_calls_the_rules_allow(
    harness: Harness, server: FakeProvider
) -> None:
    """Persona by persona: server calls == model turns the workers ran == what each group's
    rules allow; skips carry their reasons; reminders surface; models by kind; usage == bill."""
    harness.use_model_server(
        server,
        SOULFLEET_SWEEP_INTERVAL="0.2",
        SOULFLEET_SYNC_INTERVAL="1",
        SOULFLEET_REAP_QUEUED_AFTER="20",
    )
    group_of: dict[str, Group] = {}
    for group in GROUPS:
        for name in names(group):
            group_of[name] = group
            files = {"DREAM.md": f"You dream for {name}.\n"}
            if group.heartbeat is not None:
                files["HEARTBEAT.md"] = group.heartbeat.format(name=name)
            harness.persona(name, toml=group.toml, files=files)
    assert len(group_of) == 200
    fleet, client, keys = harness.fleet, harness.fleet.client, harness.fleet.keys
    _seed(fleet, group_of, time.time())
    seeded = {name: 150 if group.over_budget else 0 for name, group in group_of.items()}
    time.sleep(1.1)  # the seeded last_pass is in the past; files written from now on are new
    workers = [harness.worker("w1", concurrency=8), harness.worker("w2", concurrency=8)]

    posted = [name for name, group in group_of.items() if group.post and group.toml != BEAT + STOP]
    for name in posted:
        fleet.post(name, f"Hello {name}, I moved to Oslo.", reply=True)
    for name in (name for name, group in group_of.items() if group.toml == BEAT + STOP):
        # A persona stopped by its budget refuses the post at the door: the sender keeps it.
        with pytest.raises(BudgetStopped):
            fleet.post(name, f"Hello {name}, I moved to Oslo.", reply=True)
    wait_until(
        lambda: len(_events(workers, "turn.end")) >= len(posted),
        timeout=120,
        what="the conversations before beat starts",
    )

    beat = harness.beat()
    time.sleep(RUN_SECONDS)
    beat.stop()
    harness.drain(timeout=180)

    seen = Observed.collect(workers, beat, server, fleet)
    print(
        f"\nmodel calls: {sum(seen.calls.values())}; skipped ticks by reason: "
        f"{sum(seen.skips.values(), Counter())}; refused turns: {sum(seen.refused.values())}"
    )
    for name, group in group_of.items():
        where = f"{name} ({group.prefix})"
        assert seen.calls[name] == seen.ran[name], f"{where}: server calls != model turns run"
        if seen.calls[name]:  # turn.start names the model the server saw
            assert {f"openai:{m}" for m in seen.models[name]} == seen.logged[name], where
        spec = ScheduleSpec.from_json(
            str(client.hget(keys.schedule_spec, schedule_member(name, "heartbeat")) or "{}")
        ) if group.idle else None  # fmt: skip
        CHECKS[group.prefix](name, seen, spec)

    billed: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for served in server.served:
        row = billed[persona_of(served.body)]
        row[0] += served.input_tokens
        row[1] += served.output_tokens
        row[2] += 1
    for entry in fleet.usage(days=1):
        name = entry["persona"]
        row = billed[name]
        extra_calls = 1 if seeded[name] else 0
        assert (entry["input"], entry["output"], entry["calls"]) == (
            row[0] + seeded[name],
            row[1],
            row[2] + extra_calls,
        ), name
    assert {e["persona"] for e in fleet.usage(days=1)} == set(billed) | {
        name for name, tokens_seeded in seeded.items() if tokens_seeded
    }


def _seed(fleet: Any, group_of: dict[str, Group], now: float) -> None:
    """Redis state the groups start from: past dream passes, old posts, spent budgets."""
    client, keys = fleet.client, fleet.keys
    for name, group in group_of.items():
        if group.seed_last_pass:  # a pass newer than every file this persona has
            client.hset(keys.lane(f"{name}-dreamer"), "last_pass", int(now * 1000) + 1000)
        if group.idle:  # the newest inbound post was two hours ago
            client.hset(keys.lane(name), "last_post", int((now - 7200) * 1000))
        if group.over_budget:
            fleet.ledger.record(
                persona=name,
                day=usage_day(now),
                call_id=f"seed-{name}",
                model="openai:talk",
                kind="interactive",
                usage=Usage(150, 0),
            )


def _events(workers: list[Any], event: str) -> list[dict[str, Any]]:
    return [record for worker in workers for record in worker.events(event)]


@dataclass
class Observed:
    """What happened, per persona, from the server's records and the processes' logs."""

    calls: Counter[str]  # requests the server received
    ran: Counter[str]  # turns the workers ran with a model call
    models: dict[str, set[str]]
    skips: dict[str, Counter[str]]  # beat's tick.skipped by reason
    refused: Counter[str]  # worker turn.skipped
    emitted: dict[str, list[int]]  # due ms of each emitted tick
    surfaced: dict[str, str]
    logged: dict[str, set[str]]  # the models turn.start named, per persona

    @classmethod
    def collect(cls, workers: list[Any], beat: Any, server: FakeProvider, fleet: Any) -> Observed:
        ran: Counter[str] = Counter(
            end["lane"].removesuffix("-dreamer")
            for end in _events(workers, "turn.end")
            if end["status"] in ("done", "incomplete", "error")
        )
        models: dict[str, set[str]] = defaultdict(set)
        for body in server.bodies:
            models[persona_of(body)].add(body["model"])
        skips: dict[str, Counter[str]] = defaultdict(Counter)
        for event in beat.events("tick.skipped"):
            skips[event["lane"].removesuffix("-dreamer")][event["reason"]] += 1
        emitted: dict[str, list[int]] = defaultdict(list)
        for event in beat.events("tick.emitted"):
            emitted[event["lane"]].append(int(event["due"]))
        logged: dict[str, set[str]] = defaultdict(set)
        for event in _events(workers, "turn.start"):
            logged[event["lane"].removesuffix("-dreamer")].add(str(event["model"]))
        return cls(
            calls=Counter(persona_of(body) for body in server.bodies),
            ran=ran,
            models=models,
            skips=skips,
            refused=Counter(e["lane"] for e in _events(workers, "turn.skipped")),
            emitted=emitted,
            surfaced={b.persona: b.text for b in fleet.beats(count=10_000)},
            logged=logged,
        )

    def reasons(self, name: str) -> set[str]:
        return set(self.skips[name])


def _due(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert seen.calls[name] >= 2, name
    assert seen.models[name] == {"beat"}, name
    assert seen.surfaced.get(name) == f"Reminder: call {name}", f"{name}: reminder surfaced"


def _blank(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert (seen.calls[name], seen.reasons(name)) == (0, {"blank_heartbeat"}), name
    assert seen.skips[name]["blank_heartbeat"] >= 2, name


def _no_file(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert (seen.calls[name], seen.reasons(name)) == (0, {"no_heartbeat_file"}), name


def _dream_new(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert seen.calls[name] == 2, f"{name}: one conversation and one dream pass"
    assert seen.models[name] == {"talk", "dreamer"}, name
    assert seen.reasons(name) == {"nothing_new"}, f"{name}: later passes had nothing new"


def _dream_old(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert (seen.calls[name], seen.reasons(name)) == (0, {"nothing_new"}), name
    assert seen.skips[name]["nothing_new"] >= 2, name


def _idle(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert spec is not None
    emitted = seen.emitted[name]
    opening = [due for due in emitted if spec.opens_idle_window(due / 1000)]
    assert opening == emitted, f"{name}: ticked between idle windows"
    assert seen.calls[name] == len(emitted), name
    assert seen.reasons(name) == {"idle"}, name
    assert seen.skips[name]["idle"] >= 2, name


def _posted(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert seen.calls[name] >= 3, f"{name}: one conversation and heartbeats every 5 s"
    assert seen.models[name] == {"talk", "beat"}, name
    assert "idle" not in seen.reasons(name), name


def _over(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert (seen.calls[name], seen.reasons(name)) == (0, {"budget"}), name


def _over_talk(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert seen.calls[name] == 1, f"{name}: the conversation still runs"
    assert seen.models[name] == {"talk"}, name
    assert seen.reasons(name) == {"budget"}, name


def _stop(name: str, seen: Observed, spec: ScheduleSpec | None) -> None:
    assert (seen.calls[name], seen.reasons(name)) == (0, {"budget"}), name
    assert seen.refused[name] == 0, f"{name}: the post was refused at the door, not by a turn"


CHECKS: dict[str, Callable[[str, Observed, ScheduleSpec | None], None]] = {
    "due": _due,
    "comments": _blank,
    "headings": _blank,
    "nofile": _no_file,
    "dreamnew": _dream_new,
    "dreamold": _dream_old,
    "idle": _idle,
    "posted": _posted,
    "over": _over,
    "overtalk": _over_talk,
    "stop": _stop,
}

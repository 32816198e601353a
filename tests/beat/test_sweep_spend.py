"""beat/sweep.py, the spend rules: ticks that would only pay for nothing are skipped by reason.

A blank HEARTBEAT.md (comments, headings, empty list items), a used-up daily budget, an idle
persona between its stretched beats and a dream with nothing new all cost no tick and no
model call; each skip is logged and counted with its reason.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from beat.sweep import Sweeper
from tests.beat.test_sweep import skipped, sync
from tests.support.beat import RecordingPublisher, lane_ticks, write_persona
from workers.fleet import Fleet
from workers.persona.clock import VirtualClock
from workers.persona.inbox import InboxItem
from workers.persona.messages import Usage
from workers.persona.spend import heartbeat_blank, usage_day

EVERY_1M = '[heartbeat]\nevery = "1m"\n'

BLANK = [
    "",
    " \n\t\n",
    "<!-- write what to check here -->\n",
    "<!--\n  a comment\n  over lines\n-->\n# Heartbeat checklist\n\n## Today\n- \n* [ ]\n1.\n",
    "Title\n=====\n\n<!-- unclosed comment runs to the end\nwater the plants\n",
    "\ufeff\n   \n",  # a byte-order mark (an editor's) and white space
    "\ufeff<!-- write what to check here -->\n",
]
ACTIONABLE = [
    "Check the inbox.\n",
    "# Checklist\n- water the plants\n",
    "<!-- note --> due: call mum\n",
    "- [ ] renew the passport\n",
    "- due: pay the rent today\n---\n",  # a list item, then a rule: not a setext heading
    "1. call the bank\n===\n",
]


@pytest.mark.parametrize("text", BLANK)
def test_blank_heartbeat_texts(text: str) -> None:
    """Only white space, HTML comments, headings or empty list items: nothing to do."""
    assert heartbeat_blank(text)


@pytest.mark.parametrize("text", ACTIONABLE)
def test_actionable_heartbeat_texts(text: str) -> None:
    """Any other text is something to do, even next to comments and headings."""
    assert not heartbeat_blank(text)


def test_a_comment_only_heartbeat_file_is_skipped_as_blank_heartbeat(
    fleet: Fleet, persona_root: Path, clock: VirtualClock, publisher: RecordingPublisher
) -> None:
    """A HEARTBEAT.md that exists but asks for nothing is skipped (blank_heartbeat), not ticked;
    a written task makes the next beat tick."""
    write_persona(persona_root, "quiet", EVERY_1M, heartbeat=BLANK[3])
    sync(fleet)
    before = skipped("heartbeat", "blank_heartbeat")
    sweeper = Sweeper(fleet)
    clock.advance(61)
    assert sweeper.run().skipped == 1
    assert skipped("heartbeat", "blank_heartbeat") == before + 1
    assert publisher.sent == []
    write_persona(persona_root, "quiet", EVERY_1M, heartbeat="- water the plants\n")
    clock.advance(60)
    assert sweeper.run().emitted == 1


def test_a_persona_over_its_daily_budget_is_skipped_with_reason_budget(
    fleet: Fleet, persona_root: Path, clock: VirtualClock, publisher: RecordingPublisher
) -> None:
    """Today's tokens at or over budget.daily_tokens: heartbeats and dreams are skipped
    (budget); under it they tick; the next day the budget is fresh."""
    budget = '[budget]\ndaily_tokens = 100\n[dream]\nevery = "1m"\n'
    write_persona(persona_root, "spender", EVERY_1M + budget)
    write_persona(persona_root, "saver", EVERY_1M + budget)
    sync(fleet)
    day = usage_day(clock.time())
    for persona, tokens in (("spender", 100), ("saver", 99)):
        fleet.ledger.record(
            persona=persona,
            day=day,
            call_id=f"{persona}-seed",
            model="openai:m",
            kind="interactive",
            usage=Usage(tokens, 0),
        )
    before = skipped("heartbeat", "budget") + skipped("dream", "budget")
    sweeper = Sweeper(fleet)
    clock.advance(61)
    report = sweeper.run()
    assert (report.emitted, report.skipped) == (2, 2)
    assert skipped("heartbeat", "budget") + skipped("dream", "budget") == before + 2
    assert sorted(publisher.lanes()) == ["saver", "saver-dreamer"]
    clock.advance(86400)
    publisher.sent.clear()
    fleet.client.delete(fleet.keys.lane("saver"), fleet.keys.lane("saver-dreamer"))
    assert sweeper.run().emitted == 4


@pytest.mark.parametrize("case", [("skip_background", True), ("stop", False)])
def test_an_over_budget_heartbeat_with_items_waiting_ticks_under_skip_background(
    fleet: Fleet,
    persona_root: Path,
    clock: VirtualClock,
    publisher: RecordingPublisher,
    case: tuple[str, bool],
) -> None:
    """An item posted without waking the persona waits for its next heartbeat. Over budget
    under ``skip_background`` that turn is a conversation, which the rule lets run: the tick
    goes through (it was skipped, and the item waited for the budget's reset). Under ``stop``
    nothing runs until the reset, so the tick is still skipped. An empty inbox: skipped."""
    on_exceed, ticks = case
    budget = f'[budget]\ndaily_tokens = 100\non_exceed = "{on_exceed}"\n'
    write_persona(persona_root, "spender", EVERY_1M + budget)
    write_persona(persona_root, "idler", EVERY_1M + budget)
    sync(fleet)
    day = usage_day(clock.time())
    for persona in ("spender", "idler"):
        fleet.ledger.record(persona=persona, day=day, call_id=f"{persona}-seed",
                            model="openai:m", kind="interactive", usage=Usage(100, 0))  # fmt: skip
    fleet.lanes.post("spender", InboxItem("later", "ops", "cli", "i1", clock.time()), wake=False)
    clock.advance(61)
    report = Sweeper(fleet).run()
    assert publisher.lanes() == (["spender"] if ticks else [])
    assert report.skipped == (1 if ticks else 2)


def test_an_idle_persona_beats_once_per_idle_every_until_a_post_arrives(
    fleet: Fleet, persona_root: Path, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """No inbound post for idle_after: of the 1-minute slots only one per idle_every ticks,
    the rest are skipped (idle); after a post every slot ticks again."""
    toml = '[heartbeat]\nevery = "1m"\nidle_after = "1h"\nidle_every = "10m"\n'
    write_persona(persona_root, "owl", toml)
    sync(fleet)
    sweeper = Sweeper(fleet)
    lane = fleet.keys.lane("owl")
    redis_client.hset(lane, "last_post", int((clock.time() - 7200) * 1000))
    before = skipped("heartbeat", "idle")
    ticked = 0
    for _ in range(30):
        clock.advance(60)
        redis_client.hset(lane, "state", "idle")  # no worker here: let every tick queue
        ticked += sweeper.run().emitted
    assert ticked == 3
    assert skipped("heartbeat", "idle") == before + 27
    fleet.post("owl", "good morning")
    redis_client.hset(lane, "state", "idle")
    ticked = 0
    for _ in range(5):
        clock.advance(60)
        redis_client.hset(lane, "state", "idle")
        ticked += sweeper.run().emitted
    assert ticked == 5


def test_a_dream_with_nothing_new_since_its_last_pass_is_skipped(
    fleet: Fleet, persona_root: Path, clock: VirtualClock, redis_client: redis.Redis
) -> None:
    """Dream ticks: the first pass (never dreamed) ticks; with a pass newer than every
    transcript and note the tick is skipped (nothing_new); a newer note makes it tick."""
    home = write_persona(persona_root, "nora", '[dream]\nevery = "1m"\n')
    (home / "memory").mkdir()
    (home / "memory" / "people.md").write_text("- Tom\n")
    sync(fleet)
    sweeper = Sweeper(fleet)
    dreamer = fleet.keys.lane("nora-dreamer")
    clock.advance(61)
    assert sweeper.run().emitted == 1
    redis_client.hset(dreamer, mapping={"state": "idle", "last_pass": int(time.time() * 1000)})
    before = skipped("dream", "nothing_new")
    clock.advance(60)
    assert sweeper.run().skipped == 1
    assert skipped("dream", "nothing_new") == before + 1
    time.sleep(0.05)
    (home / "memory" / "people.md").write_text("- Tom\n- Ann\n")
    clock.advance(60)
    assert sweeper.run().emitted == 1
    assert lane_ticks(redis_client, fleet.keys, ["nora-dreamer"]) == {"nora-dreamer": 2}

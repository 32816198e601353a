"""Tests for workers/persona/driver.py: beats, coalescing, silence, posting (VirtualClock)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.turns import PacedModel, make_persona
from workers.persona.agent import from_dir
from workers.persona.clock import VirtualClock
from workers.persona.driver import HeartbeatDriver, start_agent
from workers.persona.heartbeat import HEARTBEAT_PROMPT
from workers.persona.loop import Budget
from workers.persona.messages import Completion, Message, ToolSpec
from workers.persona.models import Model
from workers.persona.models.scripted import ScriptedModel


@pytest.fixture(autouse=True)
def _no_fleet_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOULFLEET_MODEL", raising=False)


def started(
    tmp_path: Path,
    model: Model,
    clock: VirtualClock,
    *,
    every: float = 10.0,
    beats: list[str] | None = None,
    budget: Budget | None = None,
) -> HeartbeatDriver:
    home = make_persona(tmp_path)
    on_beat = None if beats is None else beats.append
    return start_agent(home, every=every, clock=clock, model=model, on_beat=on_beat, budget=budget)


def test_no_turn_before_the_first_interval(tmp_path: Path) -> None:
    """Starting arms a timer; nothing runs until `every` seconds have passed."""
    clock = VirtualClock()
    model = PacedModel(clock, [])
    driver = started(tmp_path, model, clock)
    clock.advance(9.999)
    assert driver.turns == 0
    clock.advance(0.001)
    assert driver.turns == 1
    assert model.prompts == [
        f"{HEARTBEAT_PROMPT}\n\nInbox (1 entry, oldest first):\n\n"
        "- tick x1 {from: ava, channel: heartbeat}"
    ]


def test_each_interval_beats_again(tmp_path: Path) -> None:
    """The beat re-arms itself: three intervals, three turns (each with one tick)."""
    clock = VirtualClock()
    model = PacedModel(clock, [])
    driver = started(tmp_path, model, clock)
    clock.advance(30)
    assert driver.turns == 3
    assert all("tick x1 " in p for p in model.prompts)


def test_heartbeat_ok_is_silent(tmp_path: Path) -> None:
    """A reply containing HEARTBEAT_OK never reaches on_beat or beats."""
    clock = VirtualClock()
    beats: list[str] = []
    driver = started(
        tmp_path, PacedModel(clock, [], reply="All quiet. HEARTBEAT_OK"), clock, beats=beats
    )
    clock.advance(50)
    assert driver.turns == 5
    assert beats == []
    assert driver.beats == []


def test_a_substantive_reply_goes_to_on_beat(tmp_path: Path) -> None:
    """A reply without HEARTBEAT_OK is surfaced: on_beat gets it and beats records it."""
    clock = VirtualClock()
    beats: list[str] = []
    driver = started(
        tmp_path, PacedModel(clock, [], reply="Reminder: water the plants"), clock, beats=beats
    )
    clock.advance(20)
    assert beats == ["Reminder: water the plants"] * 2
    assert driver.beats == beats


def test_ticks_during_a_running_turn_coalesce_into_exactly_one_turn(tmp_path: Path) -> None:
    """Three ticks that fire while a slow turn runs make exactly ONE follow-up turn, tick x3."""
    clock = VirtualClock()
    model = PacedModel(clock, [35.0])  # the first turn runs from t=10 to t=45
    driver = started(tmp_path, model, clock)
    clock.advance(10)
    assert driver.turns == 2
    assert "tick x1 " in model.prompts[0]
    assert "tick x3 " in model.prompts[1]
    assert driver.pending == (0, 0)
    clock.advance(4.999)  # now t=44.999+... the next beat is due at t=50
    assert driver.turns == 2
    clock.advance(5)
    assert driver.turns == 3
    assert "tick x1 " in model.prompts[2]


def test_post_waits_for_the_next_turn_and_keeps_provenance(tmp_path: Path) -> None:
    """A posted item (no wake) is drained by the next beat's turn, with its {from, channel}."""
    clock = VirtualClock()
    model = PacedModel(clock, [])
    driver = started(tmp_path, model, clock)
    driver.post("the parcel arrived", "door-bot", "webhook")
    assert driver.turns == 0
    assert driver.pending == (1, 0)
    clock.advance(10)
    assert driver.turns == 1
    assert "Inbox (2 entries, oldest first within each part):" in model.prompts[0]
    assert "- {from: door-bot, channel: webhook}\n  the parcel arrived" in model.prompts[0]
    assert "[UNTRUSTED " in model.prompts[0]


def test_post_with_wake_runs_a_turn_now(tmp_path: Path) -> None:
    """post(..., wake=True) on an idle persona runs one turn at once, without a tick (no beat)."""
    clock = VirtualClock()
    model = PacedModel(clock, [], reply="On it.")
    beats: list[str] = []
    driver = started(tmp_path, model, clock, beats=beats)
    driver.post("hello", "ava/cli", "cli", wake=True)
    assert driver.turns == 1
    assert model.prompts == [
        "Inbox (1 entry, oldest first):\n\n- {from: ava/cli, channel: cli}\n  hello"
    ]
    assert beats == []  # not a heartbeat turn: an answer to the event, not a beat
    assert driver.last_result is not None
    assert driver.last_result.text == "On it."


def test_items_posted_during_a_turn_join_the_single_follow_up(tmp_path: Path) -> None:
    """Items and ticks arriving mid-turn are drained together by one follow-up turn."""
    clock = VirtualClock()
    holder: dict[str, HeartbeatDriver] = {}

    class Posting(PacedModel):
        def complete(
            self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
        ) -> Completion:
            if len(self.prompts) == 0:
                holder["d"].post("mid-turn note", "ava/cli", "cli", wake=True)
            return super().complete(system=system, messages=messages, tools=tools)

    model = Posting(clock, [25.0])
    holder["d"] = driver = started(tmp_path, model, clock)
    clock.advance(10)
    assert driver.turns == 2
    assert "tick x2 " in model.prompts[1]
    assert "mid-turn note" in model.prompts[1]


def test_wake_with_nothing_pending_does_nothing(tmp_path: Path) -> None:
    """wake() on an empty inbox runs no turn and says so."""
    clock = VirtualClock()
    driver = started(tmp_path, PacedModel(clock, []), clock)
    assert driver.wake() is False
    assert driver.turns == 0


def test_stop_cancels_the_beats(tmp_path: Path) -> None:
    """After stop() no further turn runs, however far the clock moves."""
    clock = VirtualClock()
    driver = started(tmp_path, PacedModel(clock, []), clock)
    clock.advance(10)
    driver.stop()
    clock.advance(100)
    assert driver.turns == 1
    driver.post("late", "ava", "cli", wake=True)
    assert driver.turns == 1


def test_stop_during_a_turn_prevents_the_follow_up(tmp_path: Path) -> None:
    """A turn running when stop() is called finishes, and no follow-up starts."""
    clock = VirtualClock()
    holder: dict[str, HeartbeatDriver] = {}

    class Stopping(PacedModel):
        def complete(
            self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
        ) -> Completion:
            answer = super().complete(system=system, messages=messages, tools=tools)
            holder["d"].stop()
            return answer

    holder["d"] = driver = started(tmp_path, Stopping(clock, [30.0]), clock)
    clock.advance(100)
    assert driver.turns == 1


def test_unfinished_turns_are_not_surfaced(tmp_path: Path) -> None:
    """An incomplete turn's text never reaches on_beat."""
    clock = VirtualClock()
    beats: list[str] = []
    driver = started(
        tmp_path,
        PacedModel(clock, [], reply="partial"),
        clock,
        beats=beats,
        budget=Budget(max_model_calls=0),
    )
    clock.advance(10)
    assert driver.turns == 1
    assert driver.last_result is not None
    assert driver.last_result.status == "incomplete"
    assert beats == []


def test_a_turn_that_cannot_run_keeps_its_items(tmp_path: Path) -> None:
    """If the persona directory vanished, the turn fails and its posted items stay pending."""
    clock = VirtualClock()
    driver = started(tmp_path, PacedModel(clock, []), clock)
    shutil.rmtree(tmp_path / "ava")
    driver.post("keep me", "ava/cli", "cli", wake=True)
    assert driver.turns == 0
    assert driver.pending == (1, 0)
    assert not driver.running


def test_the_builtin_script_drives_a_due_heartbeat(tmp_path: Path) -> None:
    """With no model configured, a due HEARTBEAT.md line surfaces via the built-in script."""
    clock = VirtualClock()
    home = make_persona(tmp_path, files={"HEARTBEAT.md": "- due: water the plants"})
    beats: list[str] = []
    driver = start_agent(home, every=60, clock=clock, on_beat=beats.append)
    clock.advance(60)
    assert beats == ["Reminder: water the plants"]
    assert driver.model.spec == "scripted:builtin"


def test_start_agent_accepts_an_agent_def(tmp_path: Path) -> None:
    """An AgentDef (e.g. with a name override) works like a path."""
    clock = VirtualClock()
    model = PacedModel(clock, [])
    agent = from_dir(make_persona(tmp_path), name="ava-main")
    driver = start_agent(agent, every=5, clock=clock, model=model)
    clock.advance(5)
    assert driver.turns == 1
    assert "{from: ava-main, channel: heartbeat}" in model.prompts[0]


def test_every_must_be_positive(tmp_path: Path) -> None:
    """A non-positive interval is refused."""
    with pytest.raises(ValueError, match="every"):
        started(tmp_path, PacedModel(VirtualClock(), []), VirtualClock(), every=0)


def test_a_dream_schedule_runs_the_dreamer_silently_on_the_same_clock(tmp_path: Path) -> None:
    """[dream] every = ... starts the dreamer: its pass is logged to note:log, never surfaced."""
    clock = VirtualClock()
    home = make_persona(tmp_path, manifest='[dream]\nevery = "1h"\n')
    beats: list[str] = []
    loud = ScriptedModel.from_rules(
        {
            "rules": [
                {
                    "when": {
                        "section": "HEARTBEAT.md",
                        "section_contains": "You are this persona's dreamer",
                        "tool_results": 0,
                    },
                    "calls": [
                        {
                            "tool": "memory",
                            "args": {"action": "add", "target": "note:log", "text": "dreamt"},
                        }
                    ],
                },
                {"text": "something substantive"},
            ]
        }
    )
    driver = start_agent(home, every=1800, clock=clock, model=loud, on_beat=beats.append)
    assert driver.dreamer is not None
    assert driver.dreamer.agent.name == "ava-dreamer"
    clock.advance(3600)
    assert driver.turns == 2
    assert driver.dreamer.turns == 1
    assert (home / "memory" / "log.md").read_text() == "- dreamt\n"
    assert beats == ["something substantive"] * 2
    assert driver.dreamer.beats == []
    driver.stop()
    clock.advance(7200)
    assert (driver.turns, driver.dreamer.turns) == (2, 1)


def test_beats_outside_active_hours_or_with_nothing_to_do_are_skipped(tmp_path: Path) -> None:
    """As the fleet's beat does: no turn outside [heartbeat] active_hours, and none while
    HEARTBEAT.md is blank (only headings and comments) or missing; a due line inside the hours
    runs one (the in-process driver ran all of them, each a model call)."""
    clock = VirtualClock(start=12 * 3600.0)  # 12:00 UTC
    home = make_persona(tmp_path, manifest=(
        '[heartbeat]\nevery = "10s"\n'
        'active_hours = { start = "08:00", end = "09:00", timezone = "UTC" }\n'
    ))  # fmt: skip
    model = PacedModel(clock, [])
    driver = start_agent(home, every=10, clock=clock, model=model)
    clock.advance(35)
    assert driver.turns == 0  # 12:00 is outside 08:00-09:00
    driver.stop()
    (home / "persona.toml").write_text('[heartbeat]\nevery = "10s"\n')
    (home / "HEARTBEAT.md").write_text("# Heartbeat\n<!-- nothing yet -->\n")
    driver = start_agent(home, every=10, clock=clock, model=model)
    clock.advance(35)
    assert driver.turns == 0  # blank
    (home / "HEARTBEAT.md").unlink()
    clock.advance(20)
    assert driver.turns == 0  # missing
    (home / "HEARTBEAT.md").write_text("- due: water the plants\n")
    clock.advance(10)
    assert driver.turns == 1

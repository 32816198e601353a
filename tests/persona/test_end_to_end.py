"""End to end with the scripted model and real persona directories: soul, memory, heartbeats,
coalescing, budgets, durable transcripts and transcript_search (issue 3 "Must show")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.turns import ALL_SEVEN, Watched, make_persona
from workers.persona.clock import VirtualClock
from workers.persona.dream_agent import DREAM_PROMPT, dreamer
from workers.persona.driver import start_agent
from workers.persona.heartbeat import HEARTBEAT_OK, HEARTBEAT_PROMPT
from workers.persona.home import BOOTSTRAP_ORDER, compose_soul
from workers.persona.loop import Budget, Limit, RunResult
from workers.persona.messages import Message
from workers.persona.models.scripted import ScriptedModel
from workers.persona.runner import run, run_agent
from workers.persona.search import transcript_search_tool
from workers.persona.transcripts import FileTranscripts

RULES = """
[[rules]]
name = "sections"
when = { user_contains = "which sections?" }
text = "sections: {sections}"

[[rules]]
name = "remember"
when = { user_regex = 'remember: (.+)', tool_results = 0 }
calls = [{ tool = "memory", args = { action = "add", text = "{match}" } }]

[[rules]]
name = "report"
when = { tool_results = 1 }
text = "Noted. {tool_result}"

[[rules]]
name = "recall"
when = { user_contains = "what do you remember?", section = "MEMORY.md" }
text = "I remember: {section}"

[[rules]]
name = "plain"
text = "you said: {user}"
"""


@pytest.fixture(autouse=True)
def _no_fleet_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOULFLEET_MODEL", raising=False)


@pytest.fixture
def rules(tmp_path: Path) -> str:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    return f"scripted:{path}"


def on_disk(home: Path, lane: str = "ava") -> list[tuple[Message, ...]]:
    """Every conversation of the lane, read back by a NEW store (as after a restart)."""
    store = FileTranscripts(home)
    return [
        tuple(r.message for r in store.messages(c.id))
        for c in store.conversations()
        if c.lane == lane
    ]


def test_the_composed_soul_is_the_system_prompt_in_bootstrap_order(
    tmp_path: Path, rules: str
) -> None:
    """The model's system prompt is compose_soul's output, sections in bootstrap order."""
    home = tmp_path / "ava"
    home.mkdir()
    for name in reversed(BOOTSTRAP_ORDER):  # created backwards: order must come from the rule
        (home / name).write_text(f"\n  {ALL_SEVEN[name]}  \n")
    model = Watched(ScriptedModel.from_path(rules.removeprefix("scripted:")))
    result = run(home, "which sections?", model=model)
    assert result.text == "sections: " + ", ".join(BOOTSTRAP_ORDER)
    assert model.systems == [compose_soul(home)[0]]
    assert model.systems[0].startswith("## AGENTS.md\n\nOperating rules: be brief.\n\n## SOUL.md")
    assert model.systems[0].endswith("## MEMORY.md\n\n- Sam likes tea.")


def test_a_memory_add_lands_on_disk_and_only_in_the_next_runs_soul(
    tmp_path: Path, rules: str
) -> None:
    """memory add is on disk after the run, absent from that run's soul, present in the next."""
    home = make_persona(tmp_path)
    first = Watched(ScriptedModel.from_path(rules.removeprefix("scripted:")))
    result = run(home, "remember: the cat is called Tom", model=first)
    assert result.status == "done"
    assert result.text.startswith("Noted. ")
    assert (home / "MEMORY.md").read_text() == "- Sam likes tea.\n- the cat is called Tom\n"
    assert len(first.systems) == 2
    assert all("the cat is called Tom" not in system for system in first.systems)
    recall = run(home, "what do you remember?", model=rules)
    assert recall.text == "I remember: - Sam likes tea.\n- the cat is called Tom"


def test_the_builtin_script_remembers_too(tmp_path: Path) -> None:
    """With no model configured, "remember: X" is written to MEMORY.md by the built-in script."""
    home = make_persona(tmp_path)
    result = run(home, "remember: Sam's birthday is 3 May")
    assert result.text.startswith("Noted. Added an entry to MEMORY.md")
    assert "- Sam's birthday is 3 May\n" in (home / "MEMORY.md").read_text()


def test_a_due_heartbeat_surfaces_and_a_not_due_one_is_silent(tmp_path: Path) -> None:
    """Built-in script on a virtual clock: "due:" in HEARTBEAT.md surfaces, else silence."""
    clock = VirtualClock()
    due = make_persona(tmp_path, "due", {"SOUL.md": "me", "HEARTBEAT.md": "- DUE: water plants"})
    idle = make_persona(tmp_path, "idle", {"SOUL.md": "me", "HEARTBEAT.md": "- look around"})
    due_beats: list[str] = []
    idle_beats: list[str] = []
    due_driver = start_agent(due, every=1800, clock=clock, on_beat=due_beats.append)
    idle_driver = start_agent(idle, every=1800, clock=clock, on_beat=idle_beats.append)
    clock.advance(1800)
    assert due_beats == ["Reminder: water plants"]
    assert idle_beats == []
    assert (due_driver.turns, idle_driver.turns) == (1, 1)
    (idle_reply,) = [m for m in on_disk(idle, "idle")[0] if m.role == "assistant"]
    assert idle_reply.content == HEARTBEAT_OK


def test_ticks_during_a_running_turn_coalesce_into_exactly_one_turn(tmp_path: Path) -> None:
    """A scripted turn that sleeps 35s on a 10s beat is followed by ONE turn reporting tick x3."""
    clock = VirtualClock()
    script = tmp_path / "slow.toml"
    script.write_text(
        '[[rules]]\nwhen = { user_contains = "tick x1 " }\nsleep = 35\ntext = "HEARTBEAT_OK"\n'
        '[[rules]]\ntext = "HEARTBEAT_OK"\n'
    )
    home = make_persona(tmp_path)
    driver = start_agent(
        home, every=10, clock=clock, model=ScriptedModel.from_path(script, clock=clock)
    )
    clock.advance(10)
    assert driver.turns == 2
    # Both beats ran in one session, so one transcript holds both turns (issue 11).
    prompts = [m.content for messages in on_disk(home) for m in messages if m.role == "user"]
    assert len(prompts) == 2
    assert prompts[0].endswith("- tick x1 {from: ava, channel: heartbeat}")
    assert prompts[1].endswith("- tick x3 {from: ava, channel: heartbeat}")


LOOPING = """
[[rules]]
when = { user_contains = "many" }
[[rules.calls]]
tool = "memory"
args = { action = "list" }
[[rules.calls]]
tool = "memory"
args = { action = "list" }
[[rules.calls]]
tool = "memory"
args = { action = "list" }

[[rules]]
sleep = 5
calls = [{ tool = "memory", args = { action = "list" } }]
"""


@pytest.mark.parametrize(
    ("budget", "prompt", "limit"),
    [
        (Budget(max_model_calls=3), "loop", "max_model_calls"),
        (Budget(max_tool_calls=2), "many", "max_tool_calls"),
        (Budget(max_tokens=300), "loop", "max_tokens"),
        (Budget(max_seconds=12), "loop", "max_seconds"),
    ],
)
def test_each_budget_limit_is_incomplete_with_the_transcript_kept(
    tmp_path: Path, budget: Budget, prompt: str, limit: Limit
) -> None:
    """Each limit ends the run "incomplete" naming it; the transcript on disk is the whole turn."""
    clock = VirtualClock()
    script = tmp_path / "loop.toml"
    script.write_text(LOOPING)
    home = make_persona(tmp_path, manifest="notes = true\n")
    result: RunResult = run(
        home, prompt, model=ScriptedModel.from_path(script, clock=clock), budget=budget, clock=clock
    )
    assert (result.status, result.limit, result.error) == ("incomplete", limit, None)
    assert on_disk(home) == [result.messages]
    assert result.messages[0].content == prompt
    assert result.messages[-1].role == "tool"  # every call answered: a well-formed transcript
    calls = sum(len(m.tool_calls) for m in result.messages)
    assert calls == sum(1 for m in result.messages if m.role == "tool")


def test_transcripts_survive_a_restart_and_transcript_search_finds_an_earlier_run(
    tmp_path: Path,
) -> None:
    """A run in another (finished) process is read back here and found by transcript_search."""
    home = make_persona(tmp_path)
    script = (
        "import sys\nfrom workers.persona import run\nprint(run(sys.argv[1], sys.argv[2]).text)"
    )
    earlier = subprocess.run(
        [sys.executable, "-c", script, str(home), "my favourite colour is teal"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "built-in scripted model" in earlier.stdout
    later = run(home, "something else entirely")
    store = FileTranscripts(home)
    conversations = store.conversations()
    assert len(conversations) == 2
    first = [r.message for r in store.messages(conversations[0].id)]
    assert first[0].content == "my favourite colour is teal"
    assert [m.role for m in first] == ["user", "assistant"]
    assert [r.message for r in store.messages(conversations[1].id)] == list(later.messages)
    found = transcript_search_tool(store).execute({"query": "favourite colour teal"})
    assert not found.is_error
    assert f"conversation={conversations[0].id}" in found.output
    assert f"conversation={conversations[1].id}" not in found.output


def test_the_builtin_dreamer_searches_then_logs_its_pass_silently(tmp_path: Path) -> None:
    """The built-in script's dream pass: transcript_search, a note:log entry, HEARTBEAT_OK."""
    assert "You are this persona's dreamer" in DREAM_PROMPT  # the phrase the script keys on
    home = make_persona(tmp_path)
    run(home, "remember: the cat is called Tom")
    dream = dreamer(home, store=FileTranscripts(home, lanes=["ava"]))
    result = run_agent(dream, HEARTBEAT_PROMPT, model=ScriptedModel.builtin())
    assert result.text == HEARTBEAT_OK
    assert [c.name for m in result.messages for c in m.tool_calls] == [
        "transcript_search",
        "memory",
    ]
    search_result = result.messages[2]
    assert not search_result.is_error
    assert "the cat is called Tom" in search_result.content
    assert "dream pass" in (home / "memory" / "log.md").read_text()
    assert [c.lane for c in FileTranscripts(home).conversations()] == ["ava", "ava-dreamer"]

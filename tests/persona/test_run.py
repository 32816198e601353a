"""Tests for workers/persona/runner.py: run(), model choice, transcripts, and as_tool()."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.turns import Call, RecordingTool, ReplayModel, call, make_persona, says
from workers.persona.agent import from_dir
from workers.persona.errors import ModelSpecError, PersonaNotFound
from workers.persona.loop import Budget, run_loop
from workers.persona.messages import Completion
from workers.persona.models.scripted import BUILTIN_SPEC
from workers.persona.runner import as_tool, model_for, run
from workers.persona.tools import Tool
from workers.persona.transcripts import FileTranscripts


@pytest.fixture(autouse=True)
def _no_fleet_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOULFLEET_MODEL", raising=False)


def rules_file(path: Path, text: str) -> Path:
    path.write_text(f'[[rules]]\ntext = "{text}"\n')
    return path


# --- model choice --------------------------------------------------------------------------------


def test_builtin_scripted_model_when_nothing_is_configured(tmp_path: Path) -> None:
    """No argument, no persona.toml model, no SOULFLEET_MODEL: the built-in script answers."""
    home = make_persona(tmp_path)
    result = run(home, "what is on my plate?")
    assert result.status == "done"
    assert "built-in scripted model" in result.text
    assert model_for(from_dir(home)).spec == BUILTIN_SPEC


def test_explicit_spec_string_wins_over_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit spec argument beats persona.toml and SOULFLEET_MODEL."""
    arg = rules_file(tmp_path / "arg.toml", "from the argument")
    rules_file(tmp_path / "ava-rules.toml", "from persona.toml")
    env = rules_file(tmp_path / "env.toml", "from the environment")
    home = make_persona(tmp_path, manifest=f'model = "scripted:{tmp_path / "ava-rules.toml"}"\n')
    monkeypatch.setenv("SOULFLEET_MODEL", f"scripted:{env}")
    assert run(home, "hi", model=f"scripted:{arg}").text == "from the argument"
    assert run(home, "hi").text == "from persona.toml"
    assert run(home, "hi", model="inherit").text == "from persona.toml"


def test_environment_default_when_persona_inherits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With model "inherit" in persona.toml, SOULFLEET_MODEL chooses."""
    env = rules_file(tmp_path / "env.json.toml", "from the environment")
    home = make_persona(tmp_path, manifest='model = "inherit"\n')
    monkeypatch.setenv("SOULFLEET_MODEL", f"scripted:{env}")
    assert run(home, "hi").text == "from the environment"


def test_relative_scripted_path_in_persona_toml_means_the_persona_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """model = "scripted:rules.toml" in persona.toml is read from the persona's directory."""
    home = make_persona(tmp_path, manifest='model = "scripted:rules.toml"\n')
    rules_file(home / "rules.toml", "local rules")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run(home, "hi").text == "local rules"


def test_a_model_instance_is_used_as_is(tmp_path: Path) -> None:
    """A Model object passed as `model` answers the turn."""
    model = ReplayModel(says("from the object"))
    assert run(make_persona(tmp_path), "hi", model=model).text == "from the object"


def test_a_bad_spec_is_a_model_spec_error(tmp_path: Path) -> None:
    """A spec naming no model raises ModelSpecError before any turn runs."""
    home = make_persona(tmp_path)
    with pytest.raises(ModelSpecError):
        run(home, "hi", model="nonsense:x")
    assert not (home / "transcripts").exists()


def test_missing_directory_is_persona_not_found(tmp_path: Path) -> None:
    """run() on a directory that does not exist raises PersonaNotFound."""
    with pytest.raises(PersonaNotFound):
        run(tmp_path / "nobody", "hi")


# --- the turn ------------------------------------------------------------------------------------


def test_system_prompt_is_the_composed_soul_and_tools_are_the_toolset(tmp_path: Path) -> None:
    """The model sees the composed soul as system prompt and the persona's tools (memory)."""
    home = make_persona(tmp_path, files={"SOUL.md": "  I am Ava.  ", "MEMORY.md": "- tea"})
    model = ReplayModel(says("ok"))
    run(home, "hi", model=model)
    assert model.calls[0].system == "## SOUL.md\n\nI am Ava.\n\n## MEMORY.md\n\n- tea"
    assert model.calls[0].tools == ("memory",)


def test_read_only_persona_offers_no_memory_tool(tmp_path: Path) -> None:
    """memory = false in persona.toml leaves the memory tool out."""
    home = make_persona(tmp_path, manifest="memory = false\n")
    model = ReplayModel(says("ok"))
    run(home, "hi", model=model)
    assert model.calls[0].tools == ()


def test_soul_is_composed_once_per_run(tmp_path: Path) -> None:
    """An edit to a bootstrap file during the run is not seen until the next run."""
    home = make_persona(tmp_path, files={"SOUL.md": "before"})

    def edit_soul(seen: Call) -> Completion:
        (home / "SOUL.md").write_text("after")
        return call(("memory", {"action": "list"}))

    model = ReplayModel(edit_soul, says("done"))
    run(home, "hi", model=model)
    assert [c.system for c in model.calls] == ["## SOUL.md\n\nbefore"] * 2
    next_model = ReplayModel(says("ok"))
    run(home, "hi", model=next_model)
    assert next_model.calls[0].system == "## SOUL.md\n\nafter"


def test_each_run_is_a_new_conversation_in_the_persona_lane(tmp_path: Path) -> None:
    """Every message of a run is in a new transcript conversation in the lane named after it."""
    home = make_persona(tmp_path)
    first = run(home, "remember: the cat is Tom")
    second = run(home, "hello")
    store = FileTranscripts(home)
    conversations = store.conversations()
    assert [c.lane for c in conversations] == ["ava", "ava"]
    assert len({c.id for c in conversations}) == 2
    recorded = [tuple(r.message for r in store.messages(c.id)) for c in conversations]
    assert sorted(recorded, key=len) == sorted([first.messages, second.messages], key=len)


@pytest.mark.parametrize(
    ("directory", "lane"), [("zoë", "zoe"), ("my persona", "my-persona"), (".hidden", "hidden")]
)
def test_a_home_whose_name_cannot_be_a_lane_runs_and_keeps_its_session(
    tmp_path: Path, directory: str, lane: str
) -> None:
    """Any persona home runs, whatever its directory is called (`soulfleet init zoë` promises
    `run --local` works with it): its session and transcripts are kept under the nearest
    usable lane name. It raised "invalid lane name 'zoë'" with a traceback."""
    home = make_persona(tmp_path, directory)
    run(home, "remember: the cat is Tom", session=True)
    run(home, "hello", session=True)
    # One conversation: the second run continued the first's session.
    assert [c.lane for c in FileTranscripts(home).conversations()] == [lane]
    assert (home / "sessions" / lane).is_dir()


def test_run_results_carry_budget_limits(tmp_path: Path) -> None:
    """A budget passed to run() applies: a run stopped by it is incomplete, naming it."""
    home = make_persona(tmp_path)
    result = run(home, "remember: x", budget=Budget(max_tool_calls=0))
    assert (result.status, result.limit) == ("incomplete", "max_tool_calls")


# --- as_tool -------------------------------------------------------------------------------------


def test_as_tool_shape(tmp_path: Path) -> None:
    """Name is the persona's, description its `does` (or a default); input is {prompt}."""
    home = make_persona(tmp_path, manifest='does = "Keeps Sam\'s calendar."\n')
    tool = as_tool(home)
    assert isinstance(tool, Tool)
    assert tool.name == "ava"
    assert tool.description == "Keeps Sam's calendar."
    assert tool.input_schema["required"] == ["prompt"]
    assert tool.input_schema["properties"]["prompt"]["type"] == "string"
    plain = as_tool(make_persona(tmp_path, "bo"))
    assert "bo" in plain.description
    assert plain.description.strip()


def test_as_tool_returns_the_final_text(tmp_path: Path) -> None:
    """Executing the tool runs the persona and returns its final text."""
    tool = as_tool(make_persona(tmp_path), model=ReplayModel(says("the answer")))
    result = tool.execute({"prompt": "question"})
    assert (result.output, result.is_error) == ("the answer", False)


@pytest.mark.parametrize("arguments", [{}, {"prompt": 3}, {"prompt": "  "}, {"text": "hi"}])
def test_as_tool_rejects_a_missing_or_bad_prompt(
    tmp_path: Path, arguments: Mapping[str, Any]
) -> None:
    """A missing, empty or non-string prompt is an error result naming 'prompt'."""
    model = ReplayModel(says("never"))
    result = as_tool(make_persona(tmp_path), model=model).execute(arguments)
    assert result.is_error
    assert "'prompt'" in result.output
    assert model.calls == []


def test_as_tool_incomplete_and_error_are_error_results(tmp_path: Path) -> None:
    """An incomplete run names its limit; a failed model call says what failed."""
    home = make_persona(tmp_path)
    stopped = as_tool(
        home,
        model=ReplayModel(call(("memory", {"action": "list"}))),
        budget=Budget(max_model_calls=1),
    ).execute({"prompt": "go"})
    assert stopped.is_error
    assert "max_model_calls" in stopped.output
    failed = as_tool(home, model=ReplayModel(ModelSpecError("no such model"))).execute(
        {"prompt": "go"}
    )
    assert failed.is_error
    assert "no such model" in failed.output


def test_as_tool_with_an_unusable_directory_is_an_error_result(tmp_path: Path) -> None:
    """If the persona directory vanished after as_tool(), execute returns an error result."""
    home = make_persona(tmp_path)
    tool = as_tool(home, model=ReplayModel(says("x")))
    for file in home.iterdir():
        file.unlink()
    home.rmdir()
    result = tool.execute({"prompt": "hi"})
    assert result.is_error
    assert "could not run" in result.output


def test_a_persona_tool_inside_another_agents_loop(tmp_path: Path) -> None:
    """Another agent's loop can call the persona tool and sees the persona's answer."""
    persona = as_tool(make_persona(tmp_path), model=ReplayModel(says("Ava says hi")))
    outer = ReplayModel(
        call(("ava", {"prompt": "say hi"})),
        lambda seen: says(f"relayed: {seen.messages[-1].content}"),
    )
    result = run_loop(
        system="", prompt="ask ava", tools=(persona, RecordingTool()), model=outer, budget=Budget()
    )
    assert result.text == "relayed: Ava says hi"


def test_a_server_hanging_at_start_counts_against_the_turns_time(tmp_path: Path) -> None:
    """A declared MCP server that never finishes starting: the turn waits for it no longer
    than its own max_seconds (not the hub's 30 s start budget), and that wait comes out of
    the turn's time, so the turn ends at its limit instead of running a full budget after."""
    hang = f'[[tools.mcp]]\nname = "hang"\ncommand = "{sys.executable}"\n'
    hang += 'args = ["-c", "import time; time.sleep(600)"]\n'
    home = make_persona(tmp_path, manifest=hang)
    began = time.monotonic()
    result = run(home, "hi", ReplayModel(says("hello")), budget=Budget(max_seconds=3))
    took = time.monotonic() - began
    assert result.status == "incomplete"
    assert result.limit == "max_seconds"
    assert took < 3 + 15  # the wait, then closing the hung server (its 15 s bound at most)

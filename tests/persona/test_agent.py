"""from_dir and AgentDef: defaults from persona.toml, overrides, tools order, soul composed now."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import time
from pathlib import Path
from typing import Any

import pytest

from workers.persona.agent import AgentDef, from_dir
from workers.persona.errors import PersonaConfigError, PersonaNotFound
from workers.persona.home import compose_soul
from workers.persona.memory import MemoryTool, memory_tool
from workers.persona.schedules import ActiveHours, DreamSchedule, HeartbeatSchedule
from workers.persona.tools import FunctionTool, ToolResult

MANIFEST = """\
does = "Ava's assistant"
model = "anthropic:claude-x"
notes = true
memory_index_cap = true
[heartbeat]
every = "30m"
active_hours = { start = "08:00", end = "22:00", timezone = "Europe/Berlin" }
[dream]
every = "24h"
instructions = "Keep birthdays."
"""


def echo(name: str) -> FunctionTool:
    def run(arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult(str(arguments))

    return FunctionTool(name, f"{name} tool", {"type": "object", "properties": {}}, run)


@pytest.fixture
def ava(tmp_path: Path) -> Path:
    home = tmp_path / "personas" / "ava"
    home.mkdir(parents=True)
    (home / "SOUL.md").write_text("I am Ava.\n")
    return home


def test_defaults_without_manifest(ava: Path) -> None:
    """Without persona.toml: name is the last segment, model inherit, memory on, nothing else."""
    agent = from_dir(ava)
    assert agent == AgentDef(
        name="ava",
        home=ava.resolve(),
        does="",
        model="inherit",
        tools=(),
        memory=True,
        notes=False,
        memory_index_cap=None,
        heartbeat=None,
        dream=None,
    )
    assert agent.kind == "persona"


@pytest.mark.parametrize("suffix", ["", "/", "/."])
def test_name_is_the_directory_last_segment(ava: Path, suffix: str) -> None:
    """The default name is the directory's last segment, however the path is spelled."""
    assert from_dir(str(ava) + suffix).name == "ava"


def test_name_of_relative_dot_path(ava: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """from_dir(".") inside the persona names it after the directory, not "."."""
    monkeypatch.chdir(ava)
    assert from_dir(".").name == "ava"


def test_name_is_the_given_segment_not_a_link_target(ava: Path) -> None:
    """A persona reached through a symlink is named after the link, as the path says."""
    link = ava.parent / "assistant"
    link.symlink_to(ava)
    agent = from_dir(link)
    assert agent.name == "assistant"
    assert agent.home == ava.resolve()


def test_defaults_come_from_persona_toml(ava: Path) -> None:
    """persona.toml supplies does, model, notes, index cap, heartbeat and dream."""
    (ava / "persona.toml").write_text(MANIFEST)
    agent = from_dir(ava)
    assert agent.does == "Ava's assistant"
    assert agent.model == "anthropic:claude-x"
    assert agent.notes is True
    assert agent.memory_index_cap == (200, 25_600)
    assert agent.heartbeat == HeartbeatSchedule(
        1800.0, ActiveHours(time(8), time(22), "Europe/Berlin")
    )
    assert agent.dream == DreamSchedule(every=86400.0, instructions="Keep birthdays.")


def test_overrides_win_over_persona_toml(ava: Path) -> None:
    """Keyword overrides replace persona.toml values, including None to switch a schedule off."""
    (ava / "persona.toml").write_text(MANIFEST)
    agent = from_dir(
        ava,
        name="ava-test",
        does="other",
        model="scripted:/x.toml",
        notes=False,
        memory_index_cap=(10, 1000),
        heartbeat=None,
        dream=None,
    )
    assert (agent.name, agent.does, agent.model) == ("ava-test", "other", "scripted:/x.toml")
    assert agent.notes is False
    assert agent.memory_index_cap == (10, 1000)
    assert agent.heartbeat is None
    assert agent.dream is None


@pytest.mark.parametrize(("cap", "expected"), [(True, (200, 25_600)), (False, None), (None, None)])
def test_index_cap_override_forms(
    ava: Path, cap: bool | None, expected: tuple[int, int] | None
) -> None:
    """memory_index_cap=True means the contract preset; False and None mean off."""
    (ava / "persona.toml").write_text("memory_index_cap = { max_lines = 5 }\n")
    assert from_dir(ava, memory_index_cap=cap).memory_index_cap == expected


def test_extra_tools_come_before_memory(ava: Path) -> None:
    """Extra tools are offered first, in the order given, then the memory tool."""
    first, second = echo("calendar"), echo("mail")
    tools = from_dir(ava, tools=[first, second]).toolset()
    assert [tool.name for tool in tools] == ["calendar", "mail", "memory"]
    assert tools[:2] == (first, second)


def test_memory_false_is_a_read_only_persona(ava: Path) -> None:
    """memory=False leaves the memory tool out entirely."""
    assert from_dir(ava, memory=False).toolset() == ()
    calendar = echo("calendar")
    assert from_dir(ava, memory=False, tools=[calendar]).toolset() == (calendar,)


def test_memory_false_in_persona_toml(ava: Path) -> None:
    """memory = false in persona.toml also omits the tool; memory=True overrides it back."""
    (ava / "persona.toml").write_text("memory = false\n")
    assert from_dir(ava).toolset() == ()
    assert [tool.name for tool in from_dir(ava, memory=True).toolset()] == ["memory"]


def test_memory_tool_gets_notes_lock_mode_and_timeout(ava: Path) -> None:
    """toolset() builds the memory tool over the home with the persona's notes and lock mode."""
    agent = from_dir(ava, notes=True)
    [memory] = agent.toolset(lock_mode="shared", lock_timeout=2.5)
    assert isinstance(memory, MemoryTool)
    assert memory.path == ava.resolve()
    assert (memory.notes, memory.lock_mode, memory.lock_timeout) == (True, "shared", 2.5)
    assert memory.description == memory_tool(ava, notes=True).description
    [plain] = from_dir(ava).toolset()
    assert plain.input_schema == memory_tool(ava).input_schema


def test_soul_is_composed_when_called(ava: Path) -> None:
    """soul() reads the directory at call time, so edits show up at the next turn."""
    agent = from_dir(ava)
    assert agent.soul() == ("## SOUL.md\n\nI am Ava.", ["SOUL.md"])
    (ava / "MEMORY.md").write_text("- likes tea\n")
    assert agent.soul() == (
        "## SOUL.md\n\nI am Ava.\n\n## MEMORY.md\n\n- likes tea",
        ["SOUL.md", "MEMORY.md"],
    )


def test_soul_applies_index_cap_and_notes(ava: Path) -> None:
    """soul() passes the persona's index cap and notes flag to compose_soul."""
    (ava / "MEMORY.md").write_text("".join(f"- fact {n}\n" for n in range(50)))
    agent = from_dir(ava, memory_index_cap=(3, 10_000), notes=True)
    assert agent.soul() == compose_soul(ava, memory_index_cap=(3, 10_000), notes=True)
    assert agent.soul() != compose_soul(ava)


def test_definition_is_frozen(ava: Path) -> None:
    """An AgentDef cannot be changed after it is built."""
    agent = from_dir(ava)
    with pytest.raises(dataclasses.FrozenInstanceError):
        agent.name = "bob"  # type: ignore[misc]


def test_unknown_override_is_a_type_error(ava: Path) -> None:
    """An unknown keyword is a TypeError naming it."""
    overrides: dict[str, Any] = {"heartbeet": None}
    with pytest.raises(TypeError, match="heartbeet"):
        from_dir(ava, **overrides)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"memory": "no"}, TypeError),
        ({"notes": 1}, TypeError),
        ({"does": 3}, TypeError),
        ({"model": None}, TypeError),
        ({"tools": "memory"}, TypeError),
        ({"tools": [object()]}, TypeError),
        ({"memory_index_cap": (0, 10)}, ValueError),
        ({"name": ""}, ValueError),
    ],
)
def test_bad_override_values_are_refused(
    ava: Path, overrides: dict[str, Any], error: type[Exception]
) -> None:
    """Override values of the wrong type or range are refused when the definition is built."""
    with pytest.raises(error):
        from_dir(ava, **overrides)


def test_duplicate_tool_names_are_refused(ava: Path) -> None:
    """Two tools with one name (including an extra tool named memory) are refused."""
    with pytest.raises(ValueError, match="memory"):
        from_dir(ava, tools=[echo("memory")])
    with pytest.raises(ValueError, match="calendar"):
        from_dir(ava, tools=[echo("calendar"), echo("calendar")])
    assert [t.name for t in from_dir(ava, memory=False, tools=[echo("memory")]).toolset()] == [
        "memory"
    ]


def test_missing_directory_is_persona_not_found(tmp_path: Path) -> None:
    """from_dir on a path that does not exist raises PersonaNotFound."""
    with pytest.raises(PersonaNotFound):
        from_dir(tmp_path / "nobody")


def test_invalid_manifest_fails_the_definition(ava: Path) -> None:
    """A bad persona.toml surfaces from from_dir as PersonaConfigError naming the key."""
    (ava / "persona.toml").write_text('[heartbeat]\nevery = "soon"\n')
    with pytest.raises(PersonaConfigError, match=r"heartbeat\.every"):
        from_dir(ava)

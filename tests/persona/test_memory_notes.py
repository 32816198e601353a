"""The memory tool's notes tier: note:<slug> targets, read, list, the slug rule, confinement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.memory import ok
from tests.support.persona import make_persona, tree
from workers.persona.home import compose_soul
from workers.persona.memory import MemoryTool, memory_tool, valid_note_slug


def _error(tool: MemoryTool, arguments: Any) -> str:
    result = tool.execute(arguments)
    assert result.is_error, result.output
    return result.output


def test_notes_off_is_byte_identical_to_the_plain_tool(home: Path) -> None:
    """notes=False gives exactly the plain tool's description and schema (compared as JSON)."""
    plain = memory_tool(home)
    off = memory_tool(home, notes=False)
    on = memory_tool(home, notes=True)
    assert off.description == plain.description
    dump = json.dumps(plain.input_schema, sort_keys=False)
    assert json.dumps(off.input_schema, sort_keys=False) == dump
    assert on.description != plain.description
    assert json.dumps(on.input_schema) != dump


def test_notes_on_description_says_what_memory_is_for(home: Path) -> None:
    """The notes-on description says what memory is FOR and how the tiers differ."""
    description = memory_tool(home, notes=True).description
    assert "what should outlive this conversation" in description
    assert "note:<slug>" in description
    assert "memory/<slug>.md" in description
    assert "never loaded" in description
    assert "next session" in description
    schema = memory_tool(home, notes=True).input_schema
    assert schema["properties"]["action"]["enum"] == ["add", "replace", "remove", "read", "list"]
    assert schema["required"] == ["action"]


def test_note_add_creates_memory_dir_and_file(home: Path) -> None:
    """The first add to note:<slug> creates memory/<slug>.md; the note is never in the soul."""
    tool = memory_tool(home, notes=True)
    output = ok(tool, action="add", target="note:project-atlas", text="kickoff on monday")
    assert "note:project-atlas (memory/project-atlas.md)" in output
    assert "never loaded automatically" in output
    assert (home / "memory" / "project-atlas.md").read_text() == "- kickoff on monday\n"
    assert compose_soul(home) == ("", [])


def test_note_replace_remove_read(home: Path) -> None:
    """replace, remove and read work on a note like on MEMORY.md."""
    tool = memory_tool(home, notes=True)
    ok(tool, action="add", target="note:ideas", text="alpha")
    ok(tool, action="add", target="note:ideas", text="beta")
    ok(tool, **{"action": "replace", "target": "note:ideas", "text": "alpha", "with": "gamma"})
    ok(tool, action="remove", target="note:ideas", text="beta")
    assert ok(tool, action="read", target="note:ideas") == "- gamma\n"
    # A note is a document read on demand, not part of the soul: it keeps its line breaks.
    ok(tool, **{"action": "replace", "target": "note:ideas", "text": "gamma", "with": "g\nh"})
    assert ok(tool, action="read", target="note:ideas") == "- g\nh\n"


def test_read_self_user_and_missing(home: Path) -> None:
    """read returns MEMORY.md / USER.md content, says so when empty, errors for a missing note."""
    tool = memory_tool(home, notes=True)
    assert ok(tool, action="read") == "MEMORY.md is empty."
    ok(tool, action="add", target="user", text="Sam")
    assert ok(tool, action="read", target="user") == "- Sam\n"
    output = _error(tool, {"action": "read", "target": "note:nothing"})
    assert "does not exist yet" in output
    assert "list" in output
    assert not (home / "memory").exists()


def test_replace_on_a_missing_note_creates_nothing(home: Path) -> None:
    """replace/remove on a note that does not exist is an error and creates no file."""
    tool = memory_tool(home, notes=True)
    assert "not found" in _error(tool, {"action": "remove", "target": "note:x", "text": "a"})
    assert tree(home) == set()


def test_list_shows_notes_only(home: Path) -> None:
    """list shows each note with its size, sorted, and never lock, temp or foreign files."""
    tool = memory_tool(home, notes=True)
    assert ok(tool, action="list").startswith("No notes yet.")
    ok(tool, action="add", target="note:zeta", text="z")
    ok(tool, action="add", target="note:alpha", text="a")
    make_persona(home, {"memory/.hidden.md": "h", "memory/README.txt": "r", "memory/Bad.md": "b"})
    (home / "memory" / "sub.md").mkdir()
    (home / "memory" / ".alpha.md.0123456789abcdef.tmp").write_text("stray")
    assert ok(tool, action="list") == "2 note(s):\n- note:alpha (4 bytes)\n- note:zeta (4 bytes)"


@pytest.mark.parametrize(
    "slug", ["../x", "a/b", "A", ".x", "a..b", "x" * 65, "", "-x", "_x", "a b", "a\\b", "é", "x\n"]
)
def test_path_traversal_and_bad_slugs_are_refused(home: Path, slug: str) -> None:
    """Slugs outside ^[a-z0-9][a-z0-9._-]{0,63}$, or with '..', are errors; nothing is written."""
    assert not valid_note_slug(slug)
    tool = memory_tool(home, notes=True)
    for action in ("add", "read"):
        output = _error(tool, {"action": action, "target": f"note:{slug}", "text": "x"})
        assert "invalid note slug" in output
    assert tree(home) == set()
    assert list(home.parent.iterdir()) == [home]


def test_longest_valid_slug(home: Path) -> None:
    """A 64-character slug is valid and writes memory/<slug>.md."""
    slug = "a" + "b" * 62 + "9"
    assert len(slug) == 64
    assert valid_note_slug(slug)
    ok(memory_tool(home, notes=True), action="add", target=f"note:{slug}", text="ok")
    assert (home / "memory" / f"{slug}.md").exists()


@pytest.mark.parametrize("slug", ["a", "0", "log", "2024-06.review", "a_b-c.d", "v1.2"])
def test_valid_slugs(slug: str) -> None:
    """Lowercase letters, digits, '.', '_' and '-' (leading letter or digit) are valid."""
    assert valid_note_slug(slug)


@pytest.mark.parametrize("value", [None, 3, b"abc", ["a"]])
def test_non_string_slug_is_invalid(value: object) -> None:
    """valid_note_slug is False for anything that is not a string."""
    assert not valid_note_slug(value)


def test_memory_dir_symlink_leading_outside_is_refused(tmp_path: Path, home: Path) -> None:
    """A memory/ directory that links outside the persona: adds, reads and lists are refused."""
    outside = make_persona(tmp_path / "elsewhere", {"x.md": "secret\n"})
    (home / "memory").symlink_to(outside, target_is_directory=True)
    tool = memory_tool(home, notes=True)
    for call in (
        {"action": "add", "target": "note:x", "text": "pwned"},
        {"action": "read", "target": "note:x"},
        {"action": "list"},
    ):
        assert "outside the persona directory" in _error(tool, call)
    assert tree(outside) == {"x.md"}
    assert (outside / "x.md").read_text() == "secret\n"


def test_note_file_symlink_leading_outside_is_refused(tmp_path: Path, home: Path) -> None:
    """A single note that links outside is refused too, and list does not show it."""
    outside = make_persona(tmp_path / "elsewhere", {"x.md": "secret\n"})
    make_persona(home, {"memory/real.md": "- r\n"})
    (home / "memory" / "x.md").symlink_to(outside / "x.md")
    tool = memory_tool(home, notes=True)
    assert "outside" in _error(tool, {"action": "add", "target": "note:x", "text": "pwned"})
    assert "outside" in _error(tool, {"action": "read", "target": "note:x"})
    assert ok(tool, action="list") == "1 note(s):\n- note:real (4 bytes)"
    assert (outside / "x.md").read_text() == "secret\n"


def test_note_locks_live_under_dot_locks(home: Path) -> None:
    """Each note's lock file is .locks/memory/<slug>.md.lock: memory/ holds only notes."""
    tool = memory_tool(home, notes=True)
    ok(tool, action="add", target="note:log", text="dreamed")
    assert tree(home) == {
        "memory",
        "memory/log.md",
        ".locks",
        ".locks/memory",
        ".locks/memory/log.md.lock",
    }

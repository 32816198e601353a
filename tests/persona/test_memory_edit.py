"""What each memory write does to a file's bytes (pure: no files, no locks)."""

from __future__ import annotations

from workers.persona.home import MAX_FILE_BYTES
from workers.persona.memory_edit import edit
from workers.persona.memory_spec import MemoryRequest


def request(action: str, text: str, with_: str = "", target: str = "self") -> MemoryRequest:
    relative = "MEMORY.md" if target == "self" else f"memory/{target[5:]}.md"
    return MemoryRequest(action=action, target=target, relative=relative, text=text, with_=with_)


def applied(req: MemoryRequest, data: bytes | None) -> tuple[bytes, str]:
    outcome = edit(req, data)
    assert not isinstance(outcome, str), outcome
    return outcome


def test_add_appends_one_bullet_line_and_ends_an_unterminated_last_line() -> None:
    """An add is one ``- text`` line; a last line a person left without newline is ended first."""
    new, message = applied(request("add", "likes tea"), b"# Memory\n- old")
    assert new == b"# Memory\n- old\n- likes tea\n"
    assert message.startswith("Added an entry to")
    assert edit(request("add", "first"), None) == (
        b"- first\n",
        "Added an entry to MEMORY.md. "
        "It loads into your system prompt at the start of your next session.",
    )


def test_replace_and_remove_touch_only_the_first_occurrence_and_keep_other_bytes() -> None:
    """Bytes outside the match survive exactly, invalid UTF-8 included."""
    data = b"- a \xff\n- tea\n- tea\n"
    new, _ = applied(request("replace", "tea", "coffee"), data)
    assert new == b"- a \xff\n- coffee\n- tea\n"
    new, _ = applied(request("remove", "tea"), data)
    assert new == b"- a \xff\n- tea\n"  # the emptied "- " line went with it


def test_remove_keeps_a_line_that_still_has_text() -> None:
    """Only a line left empty or a bare bullet is dropped."""
    new, _ = applied(request("remove", " tea"), b"- green tea\n- x\n")
    assert new == b"- green\n- x\n"


def test_text_not_found_is_an_error_naming_the_text() -> None:
    """Nothing to write; the message tells the model to copy the text exactly."""
    outcome = edit(request("remove", "cocoa"), b"- tea\n")
    assert isinstance(outcome, str)
    assert "text not found in MEMORY.md: 'cocoa'" in outcome
    assert "Nothing was changed" in outcome


def test_no_edit_grows_a_file_past_the_cap_and_an_oversized_file_is_left_alone() -> None:
    """Past MAX_FILE_BYTES the edit is refused with the size; a file already past it too."""
    near = b"- " + b"x" * (MAX_FILE_BYTES - 10) + b"\n"
    outcome = edit(request("add", "y" * 20), near)
    assert isinstance(outcome, str)
    assert "over the" in outcome
    assert "Nothing was changed" in outcome
    too_big = b"x" * (MAX_FILE_BYTES + 1)
    outcome = edit(request("add", "y"), too_big)
    assert isinstance(outcome, str)
    assert "until a person trims it" in outcome


def test_a_note_says_it_is_not_loaded_automatically() -> None:
    """Notes are read on demand, and the answer says so."""
    new, message = applied(request("add", "plan", target="note:trip"), None)
    assert new == b"- plan\n"
    assert "note:trip" in message
    assert "never loaded automatically" in message

"""compose_soul: bootstrap order, the 2 MiB byte cap, the memory index cap, robustness."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.support.persona import make_persona
from workers.persona.errors import PersonaFileError, PersonaNotFound
from workers.persona.home import (
    BOOTSTRAP_ORDER,
    DEFAULT_INDEX_CAP,
    MAX_FILE_BYTES,
    TRUNCATION_NOTICE,
    apply_index_cap,
    compose_soul,
    edited_since,
    index_cap_notice,
    persona_home,
)
from workers.persona.runner import run

# --- the seed's three examples (seeds/000_9020d958836064e4.txt), ported verbatim -------------


def test_seed_example_1_one_bootstrap_file(tmp_path: Path) -> None:
    """Seed 000 example 1: one SOUL.md gives exactly one section, byte for byte."""
    dir_ = tmp_path / "toolnexus_doc_compose_soul_1"
    dir_.mkdir()
    (dir_ / "SOUL.md").write_text("You are Kestrel, a calm and precise research agent.")

    soul, found = compose_soul(str(dir_))

    assert found == ["SOUL.md"]
    assert soul == "## SOUL.md\n\nYou are Kestrel, a calm and precise research agent."


def test_seed_example_2_canonical_order_missing_skipped(tmp_path: Path) -> None:
    """Seed 000 example 2: files compose in bootstrap order, absent ones are simply skipped."""
    dir_ = tmp_path / "toolnexus_doc_compose_soul_2"
    dir_.mkdir()
    # Written out of canonical order on purpose.
    (dir_ / "MEMORY.md").write_text("- prefers concise answers")
    (dir_ / "AGENTS.md").write_text("Follow the repo's CLAUDE.md conventions.")
    (dir_ / "IDENTITY.md").write_text("Name: Kestrel. Role: research agent.")

    soul, found = compose_soul(dir_)

    assert found == ["AGENTS.md", "IDENTITY.md", "MEMORY.md"]
    assert soul.startswith("## AGENTS.md")
    assert "## IDENTITY.md\n\nName: Kestrel. Role: research agent." in soul
    assert soul.endswith("## MEMORY.md\n\n- prefers concise answers")
    assert soul == (
        "## AGENTS.md\n\nFollow the repo's CLAUDE.md conventions.\n\n"
        "## IDENTITY.md\n\nName: Kestrel. Role: research agent.\n\n"
        "## MEMORY.md\n\n- prefers concise answers"
    )


def test_seed_example_3_two_mb_truncation(tmp_path: Path) -> None:
    """Seed 000 example 3: an oversized MEMORY.md is truncated with the notice, disk untouched."""
    dir_ = tmp_path / "toolnexus_doc_compose_soul_3"
    dir_.mkdir()
    huge = "x" * (2 * 1024 * 1024 + 100)
    (dir_ / "MEMORY.md").write_text(huge)

    soul, found = compose_soul(dir_)

    assert found == ["MEMORY.md"]
    assert "[truncated: exceeds 2 MB bootstrap cap]" in soul
    assert len((dir_ / "MEMORY.md").read_bytes()) == len(huge.encode())
    assert len(soul.encode()) < len(huge.encode())
    assert soul == "## MEMORY.md\n\n" + "x" * MAX_FILE_BYTES + TRUNCATION_NOTICE


# --- composition ---------------------------------------------------------------------------


def test_bootstrap_order_constant() -> None:
    """The bootstrap order is the contract's: identity first, durable memory last."""
    assert BOOTSTRAP_ORDER == (
        "AGENTS.md",
        "SOUL.md",
        "IDENTITY.md",
        "USER.md",
        "TOOLS.md",
        "HEARTBEAT.md",
        "MEMORY.md",
    )
    assert MAX_FILE_BYTES == 2_097_152
    assert DEFAULT_INDEX_CAP == (200, 25_600)


def test_all_seven_files_in_order_bodies_stripped(tmp_path: Path) -> None:
    """Every bootstrap file becomes '## NAME\\n\\n' + stripped body, joined by blank lines."""
    files = {name: f"\n  body of {name}  \n\n" for name in reversed(BOOTSTRAP_ORDER)}
    make_persona(tmp_path, {**files, "NOTES.md": "not a bootstrap file", "DREAM.md": "no"})

    soul, found = compose_soul(tmp_path)

    assert found == list(BOOTSTRAP_ORDER)
    assert soul == "\n\n".join(f"## {name}\n\nbody of {name}" for name in BOOTSTRAP_ORDER)


def test_empty_directory_and_empty_file(tmp_path: Path) -> None:
    """No files gives an empty soul; an empty file is still found, with an empty body."""
    assert compose_soul(tmp_path) == ("", [])
    (tmp_path / "USER.md").write_text("   \n")
    assert compose_soul(tmp_path) == ("## USER.md\n\n", ["USER.md"])


def test_exactly_two_mib_is_not_truncated(tmp_path: Path) -> None:
    """A file of exactly 2,097,152 bytes is composed whole, with no notice."""
    make_persona(tmp_path, {"SOUL.md": "y" * MAX_FILE_BYTES})
    soul, _ = compose_soul(tmp_path)
    assert soul == "## SOUL.md\n\n" + "y" * MAX_FILE_BYTES


def test_two_mib_plus_one_is_truncated(tmp_path: Path) -> None:
    """One byte over the cap: cut at 2,097,152 bytes and the notice appended."""
    make_persona(tmp_path, {"SOUL.md": "y" * (MAX_FILE_BYTES + 1)})
    soul, _ = compose_soul(tmp_path)
    assert soul == "## SOUL.md\n\n" + "y" * MAX_FILE_BYTES + TRUNCATION_NOTICE


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_multibyte_char_straddling_the_cut_is_dropped(tmp_path: Path, char: str) -> None:
    """A character split by the byte cap is dropped whole, never emitted as U+FFFD."""
    width = len(char.encode())
    prefix = "a" * (MAX_FILE_BYTES - 1)  # the character starts at the last byte inside the cap
    make_persona(tmp_path, {"SOUL.md": prefix + char + "tail"})
    soul, _ = compose_soul(tmp_path)
    assert width > 1
    assert soul == "## SOUL.md\n\n" + prefix + TRUNCATION_NOTICE
    assert "\ufffd" not in soul


def test_truncation_notice_goes_before_the_strip(tmp_path: Path) -> None:
    """Whitespace at the cut stays in the body: the notice is appended, then the body stripped."""
    make_persona(tmp_path, {"SOUL.md": "z" * (MAX_FILE_BYTES - 3) + "   more"})
    soul, _ = compose_soul(tmp_path)
    assert soul == "## SOUL.md\n\n" + "z" * (MAX_FILE_BYTES - 3) + "   " + TRUNCATION_NOTICE


def test_disk_file_is_never_touched(tmp_path: Path) -> None:
    """Composition only reads: content and mtime of an oversized file stay as they were."""
    make_persona(tmp_path, {"MEMORY.md": "m" * (MAX_FILE_BYTES + 10)})
    before = (tmp_path / "MEMORY.md").stat()
    compose_soul(tmp_path, memory_index_cap=True)
    after = (tmp_path / "MEMORY.md").stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_huge_sparse_file_is_read_only_up_to_the_cap(tmp_path: Path) -> None:
    """A 64 GiB (sparse) MEMORY.md composes fine: only the capped prefix is ever read."""
    path = tmp_path / "MEMORY.md"
    with path.open("wb") as handle:
        handle.write(b"head")
        handle.truncate(64 * 1024**3)
    soul, found = compose_soul(tmp_path)
    assert found == ["MEMORY.md"]
    assert soul.startswith("## MEMORY.md\n\nhead\x00")
    assert soul.endswith(TRUNCATION_NOTICE)
    assert len(soul.encode()) == len("## MEMORY.md\n\n") + MAX_FILE_BYTES + len(TRUNCATION_NOTICE)


def test_path_may_be_str_or_path(tmp_path: Path) -> None:
    """compose_soul accepts a str and a pathlib.Path alike."""
    make_persona(tmp_path, {"SOUL.md": "same"})
    expected = ("## SOUL.md\n\nsame", ["SOUL.md"])
    assert compose_soul(str(tmp_path)) == compose_soul(tmp_path) == expected


# --- robustness ----------------------------------------------------------------------------


def test_invalid_utf8_is_replaced_and_warned(tmp_path: Path) -> None:
    """Invalid UTF-8 becomes U+FFFD and a soul.invalid_utf8 warning names the file."""
    make_persona(tmp_path, {"USER.md": b"caf\xe9 \xff ok", "SOUL.md": "fine"})
    with capture_logs() as logs:
        soul, found = compose_soul(tmp_path)
    assert found == ["SOUL.md", "USER.md"]
    assert soul.endswith("## USER.md\n\ncaf\ufffd \ufffd ok")
    warnings = [entry for entry in logs if entry["event"] == "soul.invalid_utf8"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["file"] == "USER.md"
    assert warnings[0]["path"] == str(tmp_path.resolve() / "USER.md")


def test_invalid_utf8_is_warned_once_per_process_until_the_file_changes(tmp_path: Path) -> None:
    """A bad file was warned about at every compose: 3-4 times per `run` or `soul` (check-up,
    then soul), and at every turn of a worker. Once per file and content; an edit that moves
    the bad byte (or changes the size) is warned about again."""
    make_persona(tmp_path, {"USER.md": b"caf\xe9 once", "SOUL.md": "fine"})
    with capture_logs() as logs:
        for _ in range(3):
            compose_soul(tmp_path)
        (tmp_path / "USER.md").write_bytes(b"still caf\xe9, longer")
        compose_soul(tmp_path)
        compose_soul(tmp_path)
    warnings = [entry for entry in logs if entry["event"] == "soul.invalid_utf8"]
    assert [w["offset"] for w in warnings] == [3, 9]


def test_directory_in_place_of_a_file_names_the_path(tmp_path: Path) -> None:
    """A directory called SOUL.md is a PersonaFileError naming that path."""
    (tmp_path / "SOUL.md").mkdir()
    with pytest.raises(PersonaFileError, match=r"SOUL\.md: is a directory") as raised:
        compose_soul(tmp_path)
    assert raised.value.path == tmp_path.resolve() / "SOUL.md"


def test_fifo_is_refused_not_blocked_on(tmp_path: Path) -> None:
    """A FIFO called AGENTS.md is refused as not a regular file (reading it would block)."""
    os.mkfifo(tmp_path / "AGENTS.md")
    with pytest.raises(PersonaFileError, match=r"AGENTS\.md: is not a regular file"):
        compose_soul(tmp_path)


def test_dangling_symlink_is_an_error(tmp_path: Path) -> None:
    """A bootstrap file that links to nothing is an error naming it, not silently skipped."""
    (tmp_path / "TOOLS.md").symlink_to(tmp_path / "gone.md")
    with pytest.raises(PersonaFileError, match=r"TOOLS\.md: is a symlink to a missing file"):
        compose_soul(tmp_path)


def test_a_bootstrap_file_shared_between_personas_is_a_hard_link(tmp_path: Path) -> None:
    """House rules shared by several personas: a hard link (or a copy) is read; a symlink out
    of the persona directory is not (its text would go to the model from anywhere)."""
    shared = tmp_path / "personas" / ".shared" / "AGENTS.md"
    make_persona(shared.parent, {"AGENTS.md": "house rules"})
    home = make_persona(tmp_path / "personas" / "ava")
    os.link(shared, home / "AGENTS.md")
    assert compose_soul(home) == ("## AGENTS.md\n\nhouse rules", ["AGENTS.md"])
    (home / "AGENTS.md").unlink()
    (home / "AGENTS.md").symlink_to(shared)
    with pytest.raises(PersonaFileError, match=r"AGENTS\.md: is a symlink to .*, outside"):
        compose_soul(home)


def test_bootstrap_link_leading_out_is_refused_and_never_composed(tmp_path: Path) -> None:
    """A bootstrap file linking out of the persona directory (here to the worker's own
    environment, and to a file above the root) fails the soul naming the file: its text would
    otherwise go to the model and into the session files."""
    (tmp_path / "secret.txt").write_text("REDIS_URL=redis://:hunter2@db")
    home = make_persona(tmp_path / "personas" / "ava", {"AGENTS.md": "rules"})
    for target in ("/proc/self/environ", str(tmp_path / "secret.txt")):
        (home / "SOUL.md").unlink(missing_ok=True)
        (home / "SOUL.md").symlink_to(target)
        with pytest.raises(PersonaFileError, match=r"SOUL\.md: is a symlink to .*, outside"):
            compose_soul(home)


def test_missing_persona_directory(tmp_path: Path) -> None:
    """A missing directory, or a file where the directory should be, is PersonaNotFound."""
    with pytest.raises(PersonaNotFound, match="persona directory not found"):
        compose_soul(tmp_path / "nobody")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(PersonaNotFound, match="not a directory"):
        compose_soul(str(tmp_path / "afile"))
    assert persona_home(str(tmp_path)) == tmp_path.resolve()


# --- memory index cap ----------------------------------------------------------------------


def _lines(count: int, width: int = 5) -> str:
    return "".join(f"- {index:0{width}d}\n" for index in range(count))


@pytest.mark.parametrize("cap", [None, False])
def test_index_cap_off_is_byte_identical(tmp_path: Path, cap: bool | None) -> None:
    """No cap (None or False) composes exactly what no argument composes."""
    make_persona(tmp_path, {"MEMORY.md": _lines(500), "SOUL.md": "s"})
    assert compose_soul(tmp_path, memory_index_cap=cap) == compose_soul(tmp_path)
    assert compose_soul(tmp_path, memory_index_cap=cap, notes=True) == compose_soul(tmp_path)


def test_index_cap_within_bounds_is_unchanged(tmp_path: Path) -> None:
    """A MEMORY.md inside both bounds composes exactly as with no cap."""
    make_persona(tmp_path, {"MEMORY.md": _lines(200)})
    assert compose_soul(tmp_path, memory_index_cap=True) == compose_soul(tmp_path)


def test_index_cap_true_keeps_200_lines(tmp_path: Path) -> None:
    """True means 200 lines / 25,600 bytes; 201 lines keep the first 200 plus the notice."""
    make_persona(tmp_path, {"MEMORY.md": _lines(201)})
    soul, _ = compose_soul(tmp_path, memory_index_cap=True)
    assert soul == "## MEMORY.md\n\n" + _lines(200).rstrip("\n") + index_cap_notice(200, 25_600)


def test_index_cap_true_byte_bound(tmp_path: Path) -> None:
    """Under 200 lines but over 25,600 bytes: the whole lines that fit, then the notice."""
    line = "- " + "w" * 197 + "\n"  # 200 bytes
    make_persona(tmp_path, {"MEMORY.md": line * 150})
    soul, _ = compose_soul(tmp_path, memory_index_cap=True)
    assert soul == "## MEMORY.md\n\n" + (line * 128).rstrip("\n") + index_cap_notice(200, 25_600)


def test_index_cap_exactly_at_both_bounds() -> None:
    """Exactly max_lines lines and exactly max_bytes bytes is within the cap: unchanged."""
    content = "aa\nbb\ncc\n"  # 3 lines, 9 bytes
    assert apply_index_cap(content, 3, 9) == content
    assert apply_index_cap("aa\nbb\ncc", 3, 8) == "aa\nbb\ncc"


def test_index_cap_one_over_each_bound() -> None:
    """One byte or one line over: the longest run of whole leading lines within both bounds."""
    content = "aa\nbb\ncc\n"
    assert apply_index_cap(content, 3, 8) == "aa\nbb" + index_cap_notice(3, 8)
    assert apply_index_cap(content, 2, 9) == "aa\nbb" + index_cap_notice(2, 9)
    assert apply_index_cap(content, 1, 100) == "aa" + index_cap_notice(1, 100)


def test_index_cap_lone_overlong_first_line_cut_at_code_point() -> None:
    """A first line longer than max_bytes is cut at a code-point boundary, never mid-character."""
    content = "é" * 10 + "\nsecond\n"  # the first line is 20 bytes
    assert apply_index_cap(content, 5, 7) == "ééé" + index_cap_notice(5, 7)
    assert apply_index_cap("😀😀", 5, 6) == "😀" + index_cap_notice(5, 6)
    assert apply_index_cap("😀😀", 5, 3) == "" + index_cap_notice(5, 3)


def test_index_cap_explicit_tuple_and_notes_wording(tmp_path: Path) -> None:
    """An explicit (lines, bytes) cap; the notice states the CAP values, worded for notes on/off."""
    make_persona(tmp_path, {"MEMORY.md": _lines(10)})
    plain, _ = compose_soul(tmp_path, memory_index_cap=(3, 1000))
    noted, _ = compose_soul(tmp_path, memory_index_cap=(3, 1000), notes=True)
    kept = "## MEMORY.md\n\n" + _lines(3).rstrip("\n")
    assert plain == kept + index_cap_notice(3, 1000)
    assert noted == kept + index_cap_notice(3, 1000, notes=True)
    assert index_cap_notice(3, 1000) == (
        "\n[memory index truncated: MEMORY.md is capped at 3 lines / 1000 bytes; keep it short: "
        "replace or remove entries that no longer matter]"
    )
    assert index_cap_notice(3, 1000, notes=True) == (
        "\n[memory index truncated: MEMORY.md is capped at 3 lines / 1000 bytes; keep MEMORY.md "
        "a short index and move details into note:<slug> files (memory tool: list, read)]"
    )


def test_index_cap_applies_to_memory_only(tmp_path: Path) -> None:
    """USER.md and the other bootstrap files are never index-capped."""
    make_persona(tmp_path, {"USER.md": _lines(300), "MEMORY.md": _lines(2)})
    soul, _ = compose_soul(tmp_path, memory_index_cap=(2, 100))
    assert soul == compose_soul(tmp_path)[0]


def test_index_cap_runs_after_the_byte_cap_and_before_the_strip(tmp_path: Path) -> None:
    """Over 2 MiB with a cap: the byte cap cuts first, the index cap then, the strip last."""
    make_persona(tmp_path, {"MEMORY.md": "\n\n" + "v" * MAX_FILE_BYTES})
    soul, _ = compose_soul(tmp_path, memory_index_cap=(3, 10))
    # Lines: "", "", then one 2 MiB line ending in the truncation notice: too long, so the
    # first two (empty) lines are kept, and the strip removes them.
    assert soul == "## MEMORY.md\n\n" + index_cap_notice(3, 10).strip()


@pytest.mark.parametrize("cap", [(0, 10), (10, 0), (1.5, 10), ("1", 10), (True, 10), (1, 2, 3), 7])
def test_bad_cap_is_a_caller_error(tmp_path: Path, cap: object) -> None:
    """A cap that is neither None, a bool nor two positive ints raises TypeError or ValueError."""
    with pytest.raises((TypeError, ValueError)):
        compose_soul(tmp_path, memory_index_cap=cap)  # type: ignore[arg-type]


def test_index_cap_takes_the_persona_toml_mapping_form(tmp_path: Path) -> None:
    """compose_soul(dir, memory_index_cap={"max_lines": 2, "max_bytes": 10000}), the form the
    README documents for persona.toml, caps like the tuple; other keys are refused."""
    home = make_persona(tmp_path, {"MEMORY.md": "".join(f"- fact {n}\n" for n in range(10))})
    as_tuple, _ = compose_soul(home, memory_index_cap=(2, 10000))
    as_mapping, _ = compose_soul(home, memory_index_cap={"max_lines": 2, "max_bytes": 10000})
    assert as_mapping == as_tuple
    assert "- fact 2" not in as_mapping
    with pytest.raises(TypeError, match="exactly max_lines and max_bytes"):
        compose_soul(home, memory_index_cap={"lines": 2})


def test_an_empty_path_names_no_persona(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compose_soul("") and run("", ...) do not take the working directory for a persona
    (run wrote transcripts/ into it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "SOUL.md").write_text("I am whatever directory I was started in.\n")
    for empty in ("", "  "):
        with pytest.raises(PersonaNotFound, match="an empty path names no persona"):
            compose_soul(empty)
        with pytest.raises(PersonaNotFound):
            run(empty, "hi")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SOUL.md"]


def test_edited_since_names_the_files_people_changed_after_the_soul_was_frozen(
    tmp_path: Path,
) -> None:
    """A frozen soul against the files now: a changed, removed or new file people edit is
    named (in bootstrap order); MEMORY.md and USER.md, which the persona writes itself and its
    next session picks up by contract, are not; unchanged files give nothing."""
    home = make_persona(tmp_path / "ava", {
        "SOUL.md": "You are Ava.\n", "HEARTBEAT.md": "# Heartbeat\n", "IDENTITY.md": "Ava\n",
        "MEMORY.md": "- likes tea\n", "USER.md": "Sam\n",
    })  # fmt: skip
    soul, _ = compose_soul(home)
    assert edited_since(home, soul) == []
    (home / "MEMORY.md").write_text("- likes tea\n- and cake\n")
    (home / "USER.md").write_text("Sam, a baker\n")
    assert edited_since(home, soul) == []
    (home / "HEARTBEAT.md").write_text("# Heartbeat\n- due: call mum\n")
    (home / "IDENTITY.md").unlink()
    (home / "TOOLS.md").write_text("Use the memory tool.\n")
    assert edited_since(home, soul) == ["IDENTITY.md", "TOOLS.md", "HEARTBEAT.md"]
    (home / "SOUL.md").write_text("\n  You are Ava.  \n\n")  # the same section once stripped
    assert "SOUL.md" not in edited_since(home, soul)


def test_edited_since_compares_whole_sections(tmp_path: Path) -> None:
    """A file cut short (its new text a prefix of the frozen one) is edited, its unchanged
    neighbours are not; with nothing edited nothing is named, even when a file's text quotes
    another file's header."""
    home = make_persona(tmp_path / "ava", {
        "SOUL.md": "Quoting a header:\n\n## TOOLS.md\n\nnot a section",
        "HEARTBEAT.md": "- a\n- b\n", "MEMORY.md": "- tea\n",
    })  # fmt: skip
    soul, _ = compose_soul(home)
    assert edited_since(home, soul) == []
    (home / "MEMORY.md").write_text("- tea\n- cake\n")
    assert edited_since(home, soul) == []
    (home / "HEARTBEAT.md").write_text("- a\n")
    edited = edited_since(home, soul)
    assert "HEARTBEAT.md" in edited
    assert "SOUL.md" not in edited


def test_edited_since_sees_a_removed_file_behind_one_the_persona_writes(tmp_path: Path) -> None:
    """USER.md (the persona's own, whatever it held) then TOOLS.md then HEARTBEAT.md: TOOLS.md
    removed is named, not taken for part of USER.md's section."""
    home = make_persona(tmp_path / "ava", {
        "USER.md": "Sam\n", "TOOLS.md": "Use the memory tool.\n", "HEARTBEAT.md": "- a\n",
    })  # fmt: skip
    soul, _ = compose_soul(home)
    (home / "USER.md").write_text("Sam, a baker\n")
    assert edited_since(home, soul) == []
    (home / "TOOLS.md").unlink()
    assert edited_since(home, soul) == ["TOOLS.md"]

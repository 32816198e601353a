"""Transcript file names and records: what every reader and writer of a lane agrees on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from workers.persona.transcript_layout import (
    ConversationInfo,
    file_name,
    parse_file_name,
    read_records,
    require_name,
)


def test_a_file_name_parses_back_to_its_conversation() -> None:
    """The name holds the start time (ms) and the id; parsing it gives the same conversation."""
    info = ConversationInfo(id="turn-7.a_b", lane="ava", started_at=1_700_000_000.125)
    name = file_name(info)
    assert name == "001700000000125-turn-7.a_b.jsonl"
    assert parse_file_name("ava", name) == info


def test_names_sort_oldest_first_as_plain_strings() -> None:
    """Zero-padded stamps: a plain sort of the names (what ``ls`` does) is start order."""
    infos = [ConversationInfo(id=f"c{n}", lane="ava", started_at=t) for n, t in
             enumerate([9.5, 1_700_000_000.0, 10.0, 0.001])]  # fmt: skip
    names = sorted(file_name(info) for info in infos)
    assert [parse_file_name("ava", n).started_at for n in names] == [0.001, 9.5, 10.0, 1.7e9]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "name",
    ["README", "001700000000125-x.json", "00170000000012-x.jsonl", "0017000000001x5-x.jsonl",
     "001700000000125_x.jsonl", "001700000000125-.jsonl", "001700000000125-a..b.jsonl",
     "001700000000125-.hidden.jsonl"],
)  # fmt: skip
def test_other_files_in_a_lane_directory_are_not_conversations(name: str) -> None:
    """Anything but ``<15 digits>-<slug>.jsonl`` is ignored by listings, never misread."""
    assert parse_file_name("ava", name) is None


@pytest.mark.parametrize("name", ["", "../x", "a/b", "a..b", ".hidden", "x" * 129, None, 7])
def test_require_name_refuses_what_could_leave_a_lane_directory(name: object) -> None:
    """Lane names and ids are one safe path segment; the error says what a name may be."""
    with pytest.raises(ValueError, match="use 1-128 letters, digits"):
        require_name("lane", name)


def test_read_records_skips_the_header_and_every_unreadable_line(tmp_path: Path) -> None:
    """A hand-edited or torn file yields the good records in order and a warning per bad line."""
    path = tmp_path / "c.jsonl"
    good = {"at": 2.5, "message": {"role": "user", "content": "hi"}}
    path.write_text(
        "\n".join([
            json.dumps({"transcript": 1, "conversation": "c", "lane": "ava", "started_at": 1.0}),
            json.dumps(good),
            json.dumps({"at": "soon", "message": {"role": "user", "content": "x"}}),
            "[1, 2]",
            json.dumps({**good, "at": 3.0}),
            '{"at": 4.0, "mess',
        ])
    )  # fmt: skip
    with capture_logs() as logs:
        records = list(read_records("c", str(path)))
    assert [(r.at, r.message.content) for r in records] == [(2.5, "hi"), (3.0, "hi")]
    assert [(e["event"], e["line"]) for e in logs] == [
        ("transcript.bad_record", 3),
        ("transcript.bad_record", 4),
        ("transcript.torn_line", 6),
    ]


def test_read_records_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    """A file pruned between listing and reading is simply no records."""
    assert list(read_records("gone", str(tmp_path / "gone.jsonl"))) == []

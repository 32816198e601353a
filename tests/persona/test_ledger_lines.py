"""The write ledger's lines (workers/persona/ledger_lines.py)."""

from __future__ import annotations

from pathlib import Path

from workers.persona.ledger_lines import (
    Intent,
    answer_line,
    count_answers,
    find_answer,
    generation_line,
    generation_of,
    intent_line,
    last_line,
    ledger_identity,
    parse_intent,
    parsed_at,
    tail_digest,
)


def test_an_answer_is_the_newest_whole_line_recorded_under_its_key() -> None:
    """find_answer parses only lines that start with the key's record: the newest one wins, a
    torn or hand-edited line holding the key is passed over for an older whole one, and a key
    named only inside another line (an intent listing a waiter's key) is no answer."""
    line = b'{"key": "qabc", "message": "%s"}\n'
    raw = line % b"first" + b'{"key": "other", "message": "x"}\n' + line % b"second"
    assert find_answer(raw, "qabc") == "second"
    assert find_answer(raw + b'{"key": "qabc", "message": "cut sh', "qabc") == "second"
    assert find_answer(raw + b'junk {"key": "qabc", "message": "no"}\n', "qabc") == "second"
    intent = b'{"intent": [1, 2], "answers": [["qnew", "Added."]]}\n'
    assert find_answer(raw + intent, "qnew") is None
    assert find_answer(raw, "qab") is None  # a prefix of a key is another key


def test_a_compacted_ledgers_first_line_names_what_it_replaced(tmp_path: Path) -> None:
    """A created ledger's first line names only its generation; a compacted one's also names
    the generation it replaced and the offset from which it kept every answer, and the
    generation is read back from either."""
    created = generation_line()
    compacted = generation_line(since="ab" * 8, kept_from=123)
    assert len(generation_of(created)) == 16
    assert len(generation_of(compacted)) == 16
    assert generation_of(compacted) != generation_of(created)
    assert b"since" not in created
    path = tmp_path / "MEMORY.md.applied"
    path.write_bytes(compacted + answer_line("qa", "Added."))
    identity = ledger_identity(str(path))
    assert identity is not None
    assert (identity.generation, identity.since, identity.kept_from) == (
        generation_of(compacted),
        "ab" * 8,
        123,
    )
    path.write_bytes(created)
    assert ledger_identity(str(path)) == (
        path.stat().st_ino,
        generation_of(created),
        len(created),
        "",
        0,
    )


def test_answers_are_counted_from_where_this_process_last_counted(tmp_path: Path) -> None:
    """A ledger counted once is counted on from where the count stopped, an answer whose
    start the first count cut through included; a new generation is counted afresh."""
    path = str(tmp_path / "MEMORY.md.applied")
    head = generation_line()
    first, second = answer_line("qa", "Added."), answer_line("qb", "Added.")
    assert count_answers(path, head + first + second[:3]) == 1  # cut inside '{"key"'
    assert count_answers(path, head + first + second) == 2
    assert count_answers(path, head + first + second + first) == 3
    assert count_answers(path, generation_line() + first) == 1


def test_answers_and_intents_read_back_as_written() -> None:
    """Answer lines carry their offsets when read back; an intent gives back its data file and
    answers; the last line of a ledger ignores its trailing newline."""
    first, second = answer_line("qa", "Added."), answer_line("qb", 'quote " and\nnewline')
    entries = parsed_at(b"junk\n" + first + second)
    assert entries == [(5, "qa", "Added."), (5 + len(first), "qb", 'quote " and\nnewline')]
    intent = intent_line((7, 42), [("qa", "Added.")])
    assert parse_intent(last_line(first + intent)) == Intent((7, 42), [("qa", "Added.")])
    appended = intent_line((7, 42), [("qa", "Added.")], b"- entry\n")
    assert parse_intent(appended) == Intent(
        (7, 42), [("qa", "Added.")], (8, tail_digest(b"- entry\n"))
    )
    assert parse_intent(b'{"intent": [7], "answers": []}') is None

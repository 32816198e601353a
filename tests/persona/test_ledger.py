"""ledger.py: intents a writer leaves before its rename, settled by the next holder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.persona import ledger as ledger_module
from workers.persona.ledger import WriteLedger
from workers.persona.ledger_lines import UNPROVABLE, ledger_identity


def test_settle_records_a_dead_writers_answers_only_if_its_rename_happened(
    tmp_path: Path,
) -> None:
    """A ledger ending with an intent (its writer died before recording the answers): settle
    records them when the data file is the one the intent names (so a queued writer waiting
    for its answer finds it), and voids the intent when it is not (a torn intent too)."""
    data = tmp_path / "MEMORY.md"
    data.write_text("- queued entry\n")
    info = data.stat()
    path = tmp_path / "MEMORY.md.applied"
    writer = WriteLedger(path)
    writer.intend((info.st_ino, info.st_size), [("qabc", "Added.")])
    later = WriteLedger(path)
    assert later.answer("qabc") is None
    later.settle(str(data))
    assert WriteLedger(path).answer("qabc") == "Added."
    WriteLedger(path).intend((info.st_ino + 1, info.st_size), [("qdef", "Added.")])
    WriteLedger(path).settle(str(data))
    assert WriteLedger(path).answer("qdef") is None
    assert path.read_bytes().endswith(b'{"void": true}\n')
    with path.open("ab") as torn:
        torn.write(b'{"intent": [1, ')
    WriteLedger(path).settle(str(data))
    assert path.read_bytes().endswith(b'{"intent": [1, \n{"void": true}\n')


def test_settle_makes_a_dead_writers_write_durable_before_its_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its writer may have died before its write was flushed (an append's data, a rename's
    directory): settle flushes the data file and its directory before it records the answers
    a retry or a waiter will trust; a voided intent needs neither."""
    data = tmp_path / "MEMORY.md"
    data.write_text("- queued entry\n")
    info = data.stat()
    path = tmp_path / "MEMORY.md.applied"
    synced: list[tuple[str, str | None]] = []
    for name in ("fsync_directory", "fsync_file"):
        monkeypatch.setattr(
            ledger_module, name,
            lambda flushed: synced.append((str(flushed), WriteLedger(path).answer("qabc"))),
        )  # fmt: skip
    WriteLedger(path).intend((info.st_ino + 1, info.st_size), [("qvoid", "Added.")])
    WriteLedger(path).settle(str(data))
    assert synced == []
    WriteLedger(path).intend((info.st_ino, info.st_size), [("qabc", "Added.")])
    WriteLedger(path).settle(str(data))
    assert synced == [(str(data), None), (str(tmp_path), None)]
    assert WriteLedger(path).answer("qabc") == "Added."


def test_settle_finds_an_intent_longer_than_the_tail_it_reads_first(tmp_path: Path) -> None:
    """Settling reads only the ledger's end at first; an intent line longer than that (a
    batch of many queued writes) is still found and finished."""
    data = tmp_path / "MEMORY.md"
    data.write_text("- entries\n")
    info = data.stat()
    path = tmp_path / "MEMORY.md.applied"
    path.write_text('{"key": "older", "message": "Added."}\n')
    answers = [(f"q{n:031x}", "Added an entry. " * 8) for n in range(20)]
    WriteLedger(path).intend((info.st_ino, info.st_size), answers)
    assert len(path.read_bytes().splitlines()[-1]) > 1024
    WriteLedger(path).settle(str(data))
    assert WriteLedger(path).answer(answers[-1][0]) == answers[-1][1]


def test_a_created_or_compacted_ledger_names_a_new_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends keep a ledger's identity; creating or compacting it gives it a new generation
    in its first line, told apart even when the new file gets the old inode number back (a
    waiter uses it to know whether its answer could have been dropped)."""
    monkeypatch.setattr(ledger_module, "MAX_ENTRIES", 2)
    path = tmp_path / "MEMORY.md.applied"
    assert ledger_identity(str(path)) is None
    WriteLedger(path).record_all([("qa", "Added.")])
    created = ledger_identity(str(path))
    assert created is not None
    assert len(created.generation) == 16
    for key in ("qb", "qc", "qd"):
        WriteLedger(path).record_all([(key, "Added.")])
    appended = ledger_identity(str(path))
    assert appended is not None
    assert appended.same_ledger(created)
    assert (appended.since, appended.kept_from) == ("", 0)  # created, never compacted
    before = path.read_bytes()
    WriteLedger(path).record_all([("qe", "Added.")])  # 2 x MAX_ENTRIES: the newest 2 are kept
    compacted = ledger_identity(str(path))
    assert compacted is not None
    assert compacted.generation != created.generation
    assert not compacted.same_ledger(created)
    # It names what it replaced, and from where in it every answer was kept (qd's line on).
    assert compacted.since == created.generation
    assert compacted.kept_from == before.index(b'{"key": "qd"')
    assert WriteLedger(path).answer("qa") is None
    assert WriteLedger(path).answer("qe") == "Added."
    same_inode = path.read_bytes().replace(compacted.generation.encode(), b"0" * 16)
    with path.open("r+b") as rewritten:  # as if a compaction had reused the inode number
        rewritten.write(same_inode)
    rewritten_identity = ledger_identity(str(path))
    assert rewritten_identity is not None
    assert (rewritten_identity.inode, rewritten_identity.generation) == (compacted.inode, "0" * 16)
    assert not rewritten_identity.same_ledger(compacted)


def test_answers_another_process_appended_count_toward_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process counts a ledger's answers from where it last counted them: lines other
    processes appended since are counted too, so the ledger is compacted at twice
    MAX_ENTRIES answers whoever wrote them."""
    monkeypatch.setattr(ledger_module, "MAX_ENTRIES", 2)
    path = tmp_path / "MEMORY.md.applied"
    WriteLedger(path).record_all([("qa", "Added.")])
    WriteLedger(path).record_all([("qb", "Added.")])  # counted here: 1 answer before it
    created = ledger_identity(str(path))
    with path.open("ab") as other:  # another process's two answers
        other.write(b'{"key": "qc", "message": "Added."}\n{"key": "qd", "message": "Added."}\n')
    WriteLedger(path).record_all([("qe", "Added.")])  # 4 answers before it: compacts
    compacted = ledger_identity(str(path))
    assert compacted is not None
    assert not compacted.same_ledger(created)
    assert WriteLedger(path).answer("qd") == "Added."
    assert WriteLedger(path).answer("qc") is None


def test_a_compaction_of_a_ledger_past_its_bound_vouches_for_no_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger longer than its read bound (answers past it were never read) is compacted with
    a kept_from beyond any offset: no waiter may take a missing answer for "not applied"."""
    monkeypatch.setattr(ledger_module, "MAX_ENTRIES", 100_000)  # compacted by size, not count
    path = tmp_path / "MEMORY.md.applied"
    WriteLedger(path).record_all([("qa", "Added.")])
    with path.open("ab") as grown:
        for index in range(5_000):
            grown.write(b'{"key": "k%d", "message": "%s"}\n' % (index, b"x" * 100))
    assert path.stat().st_size > 512 * 1024
    WriteLedger(path).record_all([("qz", "Added.")])
    compacted = ledger_identity(str(path))
    assert compacted is not None
    assert compacted.since != ""
    assert compacted.kept_from == UNPROVABLE


def test_an_append_intent_is_found_by_its_bytes_not_the_files_size(tmp_path: Path) -> None:
    """An append's intent names its bytes: found at the end it named though a line was
    appended after them (recorded), and not taken as done when the file merely grew by as
    many bytes of something else (voided: the append never happened)."""
    data = tmp_path / "MEMORY.md"
    data.write_bytes(b"- first\n- entry\n")
    inode = data.stat().st_ino
    path = tmp_path / "MEMORY.md.applied"
    WriteLedger(path).intend((inode, 16), [("qyes", "Added.")], tail=b"- entry\n")
    with data.open("ab") as person:
        person.write(b"a person's line\n")
    WriteLedger(path).settle(str(data))
    assert WriteLedger(path).answer("qyes") == "Added."
    other = tmp_path / "USER.md"
    other.write_bytes(b"- first\n")
    WriteLedger(path).intend((other.stat().st_ino, 16), [("qno", "Added.")], tail=b"- entry\n")
    with other.open("ab") as person:
        person.write(b"- other\n")  # as long as the entry, not the entry
    WriteLedger(path).settle(str(other))
    assert WriteLedger(path).answer("qno") is None
    assert path.read_bytes().endswith(b'{"void": true}\n')


def test_an_append_intent_on_another_inode_is_void(tmp_path: Path) -> None:
    """The same bytes at the same end of another file (an editor's save since) are not the
    write the intent names: voided, and the retry applies it."""
    data = tmp_path / "MEMORY.md"
    data.write_bytes(b"- first\n- entry\n")
    path = tmp_path / "MEMORY.md.applied"
    WriteLedger(path).intend(
        (data.stat().st_ino + 1, 16), [("qother", "Added.")], tail=b"- entry\n"
    )
    WriteLedger(path).settle(str(data))
    assert WriteLedger(path).answer("qother") is None
    assert path.read_bytes().endswith(b'{"void": true}\n')


def test_a_ledger_hard_linked_to_another_file_is_not_written(tmp_path: Path) -> None:
    """The memory tool's ledger (.locks/<file>.applied) swapped for a hard link to a file
    elsewhere had the writes' intents and answers appended to that file: the write is refused
    (OSError naming the link) before anything changes, and the other file is untouched."""
    path = tmp_path / "MEMORY.md.applied"
    WriteLedger(path).record_all([("qa", "Added.")])
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious\n")
    path.unlink()
    os.link(outside, path)
    with pytest.raises(OSError, match="hard links"):
        WriteLedger(path).record_all([("qb", "Added.")])
    assert outside.read_bytes() == b"precious\n"

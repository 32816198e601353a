"""The dream log stays short: older entries move, whole and in order, to memory/archive/log.md."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import structlog.testing

from tests.support.memory import ok
from workers.persona.dream_log import ARCHIVE, KEEP, LOG, ROTATE_AT
from workers.persona.home import MAX_FILE_BYTES
from workers.persona.memory import memory_tool


def _fill(home: Path, target: str, count: int, *, keyed: bool = False) -> list[str]:
    tool = memory_tool(home, notes=True, write_scope="lane:1:0" if keyed else None)
    entries = [
        f"2026-12-02T03:{n // 60:02d}:{n % 60:02d}Z pass {n}: " + "x" * 200 for n in range(count)
    ]
    for entry in entries:
        ok(tool, action="add", target=target, text=entry)
    return entries


def test_log_past_its_limit_keeps_the_newest_lines_and_archives_the_rest(home: Path) -> None:
    """Adds that take note:log past ROTATE_AT leave at most KEEP bytes of the newest entries
    in it; archive + log hold every entry exactly once, in order: nothing is lost."""
    entries = _fill(home, "note:log", 3 * ROTATE_AT // 220)
    log = (home / LOG).read_bytes()
    archive = (home / ARCHIVE).read_bytes()
    assert len(log) <= ROTATE_AT
    assert log.endswith(entries[-1].encode() + b"\n")
    both = (archive + log).decode()
    assert [line for line in both.splitlines() if "pass " in line] == [
        line for line in both.splitlines() if any(e in line for e in entries)
    ]
    found = [
        int(line.split("pass ")[1].split(":")[0]) for line in both.splitlines() if "pass " in line
    ]
    assert found == list(range(len(entries)))
    # The read a dream pass starts with sees only the kept part.
    read = ok(memory_tool(home, notes=True), action="read", target="note:log")
    assert len(read.encode()) <= ROTATE_AT
    assert entries[-1] in read
    assert entries[0] not in read


def test_a_rotation_leaves_about_keep_bytes(home: Path) -> None:
    """The write that rotates leaves at most KEEP bytes and more than KEEP minus one entry:
    the log is cut at a line start, not emptied."""
    tool = memory_tool(home, notes=True)
    sizes = [0]
    while len(sizes) < 1000:
        ok(tool, action="add", target="note:log", text=f"pass {len(sizes)}: " + "x" * 200)
        sizes.append(os.path.getsize(home / LOG))
        if sizes[-1] < sizes[-2]:
            break
    assert sizes[-2] <= ROTATE_AT < sizes[-2] + 250
    assert KEEP - 250 < sizes[-1] <= KEEP


def test_keyed_writes_rotate_too(home: Path) -> None:
    """A fleet turn's keyed writes (the dreamer's) rotate the same way."""
    _fill(home, "note:log", 2 * ROTATE_AT // 220, keyed=True)
    assert os.path.getsize(home / LOG) <= ROTATE_AT
    assert (home / ARCHIVE).stat().st_size > 0


def test_other_notes_never_rotate(home: Path) -> None:
    """Only note:log is archived: a curated note keeps every entry in place."""
    _fill(home, "note:people", 2 * ROTATE_AT // 220)
    assert os.path.getsize(home / "memory/people.md") > ROTATE_AT
    assert not (home / ARCHIVE).exists()


def test_the_archive_is_not_a_note(home: Path) -> None:
    """list shows the log, never the archive (the model cannot read or edit it)."""
    _fill(home, "note:log", 2 * ROTATE_AT // 220)
    listed = ok(memory_tool(home, notes=True), action="list")
    assert "note:log" in listed
    assert "archive" not in listed


def test_an_archive_that_cannot_be_written_leaves_the_log_whole(home: Path) -> None:
    """If the archive cannot be written (here its directory is a file), the write still
    succeeds, nothing is moved, and the operator hears why."""
    (home / "memory").mkdir(exist_ok=True)
    (home / "memory/archive").write_text("not a directory\n")
    with structlog.testing.capture_logs() as logs:
        _fill(home, "note:log", 2 * ROTATE_AT // 220)
    assert os.path.getsize(home / LOG) > ROTATE_AT
    assert any(e["event"] == "memory.log_not_archived" for e in logs)


def test_an_archive_symlinked_out_of_the_persona_is_never_written(
    home: Path, tmp_path: Path
) -> None:
    """memory/archive pointing outside the persona directory: nothing is written there."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (home / "memory").mkdir(exist_ok=True)
    (home / "memory/archive").symlink_to(outside)
    _fill(home, "note:log", 2 * ROTATE_AT // 220)
    assert list(outside.iterdir()) == []
    assert os.path.getsize(home / LOG) > ROTATE_AT


def test_a_log_already_near_the_file_cap_is_rotated_not_refused(home: Path) -> None:
    """A persona whose log grew close to MAX_FILE_BYTES before rotation existed (the case the
    rotation is for): the next pass's add must archive the old lines and go through, not be
    refused as a full file forever."""
    (home / "memory").mkdir(exist_ok=True)
    line = b"old pass: " + b"y" * 200 + b"\n"
    old = line * ((MAX_FILE_BYTES - 100) // len(line))
    (home / LOG).write_bytes(old)
    tool = memory_tool(home, notes=True)
    ok(tool, action="add", target="note:log", text="new pass: " + "z" * 300)
    log = (home / LOG).read_bytes()
    assert len(log) <= ROTATE_AT
    assert log.endswith(b"z" * 300 + b"\n")
    archive = (home / ARCHIVE).read_bytes()
    assert archive.count(b"old pass") + log.count(b"old pass") == old.count(b"old pass")


def test_an_archive_that_is_a_fifo_never_blocks_the_write(home: Path) -> None:
    """memory/archive/log.md made a FIFO (named pipe) with no reader: opening it to write
    blocked forever, inside note:log's lock, so the dream pass hung and every later writer of
    the log timed out on its lock. The archive is refused like any other non-regular file: the
    log write goes ahead, unrotated, and the operator hears why."""
    (home / "memory/archive").mkdir(parents=True)
    fifo = home / ARCHIVE
    os.mkfifo(fifo)
    outcome: list[object] = []

    def write() -> None:
        try:
            outcome.append(_fill(home, "note:log", 2 * ROTATE_AT // 220))
        except BaseException as exc:  # reported below
            outcome.append(exc)

    with structlog.testing.capture_logs() as logs:
        worker = threading.Thread(target=write, daemon=True)
        worker.start()
        worker.join(timeout=20)
        blocked = worker.is_alive()
        if blocked:  # free the thread: a reader lets its open return
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            worker.join(timeout=20)
            os.close(reader)
    assert not blocked, "the write blocked on the FIFO"
    assert isinstance(outcome[0], list), outcome
    assert os.path.getsize(home / LOG) > ROTATE_AT
    assert any(e["event"] == "memory.log_not_archived" for e in logs)

"""Memory writes keyed by a turn's work id: a retried attempt never applies a write twice."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import workers.persona.ledger
from tests.support.persona import make_persona
from workers.persona.ledger import MAX_BYTES as LEDGER_BOUND
from workers.persona.ledger import MAX_ENTRIES
from workers.persona.ledger_lines import answer_line
from workers.persona.memory import memory_tool


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_persona(tmp_path / "ava", {"MEMORY.md": "# Memory\n"})


def _run(home: Path, scope: str | None, *calls: dict[str, str]) -> list[str]:
    """One attempt of a turn: a fresh tool (as a retried turn builds), the calls in order."""
    tool = memory_tool(home, write_scope=scope)
    outputs = []
    for arguments in calls:
        result = tool.execute(arguments)
        outputs.append(("ERROR " if result.is_error else "") + result.output)
    return outputs


ADD = {"action": "add", "text": "The sky is green."}


def test_a_write_repeated_by_three_retries_is_applied_once_and_answered_as_before(
    home: Path,
) -> None:
    """The same add from four attempts of one turn (same work id): the entry is in MEMORY.md
    once, and every retry gets the very answer the first attempt got."""
    first = _run(home, "ava:7", ADD)
    for _ in range(3):
        assert _run(home, "ava:7", ADD) == first
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 1
    assert (home / ".locks" / "MEMORY.md.applied").is_file()


def test_the_next_turn_and_unkeyed_writes_still_apply(home: Path) -> None:
    """Another work id (the next turn) applies the same text again, as does a tool without a
    scope (the one-shot run, the in-process driver): only retries are deduplicated."""
    _run(home, "ava:7", ADD)
    _run(home, "ava:8", ADD)
    _run(home, None, ADD)
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 3


def test_identical_writes_within_one_attempt_are_counted_not_merged(home: Path) -> None:
    """A turn that adds the same entry twice gets it twice; its retry replays both, adds none."""
    _run(home, "ava:1", ADD, ADD)
    _run(home, "ava:1", ADD, ADD)
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 2


def test_a_retried_remove_is_answered_as_before_not_not_found(home: Path) -> None:
    """The first attempt removed the text; the retry's identical remove is not a 'not found'
    error but the original success answer, and nothing else is removed."""
    _run(home, None, ADD, ADD)
    remove = {"action": "remove", "text": "The sky is green."}
    first = _run(home, "ava:2", remove)
    assert not first[0].startswith("ERROR")
    assert _run(home, "ava:2", remove) == first
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 1


def test_a_refused_write_is_not_recorded(home: Path) -> None:
    """A write that failed (text not found) leaves no key: once the text exists, the retry's
    identical write is applied."""
    replace = {"action": "replace", "text": "old", "with": "new"}
    assert _run(home, "ava:3", replace)[0].startswith("ERROR")
    _run(home, None, {"action": "add", "text": "old"})
    assert not _run(home, "ava:3", replace)[0].startswith("ERROR")
    assert "- new" in (home / "MEMORY.md").read_text()


def test_the_ledger_stays_bounded(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many keyed writes, the ledger holds at most twice MAX_ENTRIES answers (appended
    until then, each after its intent line, then compacted to the newest MAX_ENTRIES, intents
    dropped) and always answers the newest MAX_ENTRIES (shrunk to 8 here so the test makes 40
    writes, not 1,100)."""
    assert MAX_ENTRIES >= 256  # a turn's writes (SOULFLEET_TURN_MAX_TOOL_CALLS, 64) all fit
    monkeypatch.setattr(workers.persona.ledger, "MAX_ENTRIES", 8)
    ledger = home / ".locks" / "MEMORY.md.applied"
    answers, lines = [], []
    for n in range(40):
        assert not _run(home, "ava:9", {"action": "add", "text": f"fact {n}"})[0].startswith("ERR")
        text = ledger.read_text()
        answers.append(text.count('{"key"'))
        lines.append(len(text.splitlines()))
    assert max(answers) == 16
    assert 8 in answers  # compacted, not only appended
    assert max(lines) <= 2 * 16 + 1  # and the line naming the ledger's generation
    for n in range(32, 40):
        assert _run(home, "ava:9", {"action": "add", "text": f"fact {n}"})[0].startswith("Added")
        assert (home / "MEMORY.md").read_text().count(f"fact {n}\n") == 1


def test_a_keyed_write_appends_one_line_to_the_ledger(home: Path) -> None:
    """Recording a write appends to the ledger in place (no rename): same inode; its intent
    (before the rename) and its answer (after it), one line each."""
    _run(home, "ava:1", {"action": "add", "text": "first"})
    ledger = home / ".locks" / "MEMORY.md.applied"
    inode, before = ledger.stat().st_ino, ledger.read_bytes()
    _run(home, "ava:1", {"action": "add", "text": "first"}, {"action": "add", "text": "second"})
    assert ledger.stat().st_ino == inode
    after = ledger.read_bytes()
    assert after.startswith(before)
    intent, answer = after[len(before) :].splitlines()
    assert intent.startswith(b'{"intent": [')
    assert answer.startswith(b'{"key": ')


def test_a_torn_last_ledger_line_costs_no_later_entry(home: Path) -> None:
    """A crash mid-append left half a line: the next entry starts on a new line, so it is
    read back and a retry of that write is answered from the ledger."""
    _run(home, "ava:1", {"action": "add", "text": "first"})
    ledger = home / ".locks" / "MEMORY.md.applied"
    with ledger.open("ab") as torn:
        torn.write(b'{"key": "abc", "mess')
    _run(home, "ava:2", {"action": "add", "text": "second"})
    assert _run(home, "ava:2", {"action": "add", "text": "second"})[0].startswith("Added")
    assert (home / "MEMORY.md").read_text().count("second") == 1
    assert _run(home, "ava:1", {"action": "add", "text": "first"})[0].startswith("Added")
    assert (home / "MEMORY.md").read_text().count("first") == 1


def test_a_keyed_write_costs_the_fsyncs_of_its_data_only(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the ledger exists, a keyed add to MEMORY.md flushes its data once, like an
    unkeyed one (appended in place: no directory fsync); the appended ledger line has no
    fsync of its own (issue 15)."""
    _run(home, "ava:1", {"action": "add", "text": "creates the ledger"})
    synced: list[str] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def flush(fd: int, real: Callable[[int], None] = real) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        monkeypatch.setattr(os, name, flush)
    assert _run(home, "ava:1", {"action": "add", "text": "second"})[0].startswith("Added")
    assert synced == [str(home / "MEMORY.md")]


_KILLED_AFTER_LEDGER = """
import os, signal, sys
from workers.persona.ledger import WriteLedger
from workers.persona.memory import memory_tool
record = WriteLedger.record_all
def record_then_die(self, answered):
    record(self, answered)
    os.kill(os.getpid(), signal.SIGKILL)  # the line is appended, never fsynced
WriteLedger.record_all = record_then_die
memory_tool(sys.argv[1], write_scope="ava:7").execute({"action": "add", "text": "once"})
"""


_ONCE = {"action": "add", "text": "once"}


@pytest.mark.integration
def test_a_writer_killed_after_its_unsynced_ledger_line_is_answered_from_it(home: Path) -> None:
    """The ledger line is not fsynced, but a process that dies (what retries a turn) leaves
    it in the page cache: the retry is answered from the ledger and the entry lands once."""
    _run(home, "ava:7", {"action": "add", "text": "creates the ledger"})
    done = subprocess.run([sys.executable, "-c", _KILLED_AFTER_LEDGER, str(home)], check=False)
    assert done.returncode == -signal.SIGKILL
    assert (home / "MEMORY.md").read_text().count("- once\n") == 1
    retry = _run(home, "ava:7", {"action": "add", "text": "creates the ledger"}, _ONCE)
    assert all(output.startswith("Added an entry to MEMORY.md") for output in retry)
    assert (home / "MEMORY.md").read_text().count("- once\n") == 1


_CRASHING_WRITER = """
import os, signal, sys
import workers.persona.memory_commit
from workers.persona.memory import memory_tool
workers.persona.memory_commit.append_bytes = lambda *args, **kwargs: False  # a replace
os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # die between temp and rename
memory_tool(sys.argv[1]).execute({"action": "add", "text": "half written"})
"""


@pytest.mark.integration
def test_temp_files_of_writers_killed_mid_write_are_removed_by_the_next_writer(
    home: Path,
) -> None:
    """Writers SIGKILLed after writing their temp file: each next writer (holding the lock, so
    no live writer can own one) removes its predecessor's, so they never accumulate, and a
    successful write leaves none. A temp file of ANOTHER file (USER.md) is left alone."""
    other = home / ".USER.md.0123456789abcdef.tmp"
    other.write_text("someone else's")
    seen: set[str] = set()
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", _CRASHING_WRITER, str(home)], check=False)
        assert done.returncode == -signal.SIGKILL
        stale = {p.name for p in home.glob(".MEMORY.md.*.tmp")}
        assert len(stale) == 1
        assert not stale & seen  # the previous crash's temp file is gone
        seen |= stale
    assert not memory_tool(home).execute({"action": "add", "text": "fine"}).is_error
    assert list(home.glob(".MEMORY.md.*.tmp")) == []
    assert other.exists()
    assert "half written" not in (home / "MEMORY.md").read_text()


def test_a_ledger_that_cannot_take_the_line_refuses_the_write(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger the writer may not append to (a chmod, another owner) refuses the keyed write
    before anything changes, naming the ledger: letting it through would let a retry apply it
    a second time."""
    _run(home, "ava:1", {"action": "add", "text": "first"})
    ledger = home / ".locks" / "MEMORY.md.applied"
    before = (home / "MEMORY.md").read_bytes()
    real_open = os.open

    def refusing_open(path: str, flags: int, *args: int, **kwargs: object) -> int:
        if os.fspath(path) == str(ledger) and flags & os.O_APPEND:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing_open)
    output = _run(home, "ava:1", {"action": "add", "text": "second"})[0]
    assert output.startswith("ERROR could not add")
    assert str(ledger) in output
    assert "Nothing was changed" in output
    assert (home / "MEMORY.md").read_bytes() == before
    monkeypatch.setattr(os, "open", real_open)
    assert _run(home, None, {"action": "add", "text": "unkeyed"})[0].startswith("Added")


def test_no_ledger_yet_and_no_way_to_create_it_refuses_the_write(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first keyed write of a file, with a .locks directory it may not create files in,
    is refused before MEMORY.md changes."""
    locks = str(home / ".locks")
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: False if str(path) == locks else real_access(path, mode)
    )
    output = _run(home, "ava:1", {"action": "add", "text": "first"})[0]
    assert output.startswith("ERROR could not add")
    assert locks in output
    assert (home / "MEMORY.md").read_text() == "# Memory\n"


_DIES_MID_COMMIT = """
import os, signal, sys
import workers.persona.ledger as ledger
import workers.persona.memory_commit as commit
from workers.persona.memory import memory_tool
if sys.argv[3] == "replace":
    commit.append_bytes = lambda *args, **kwargs: False
if sys.argv[2] == "after-rename":  # the new MEMORY.md is in place, its answer not recorded
    commit._record = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
else:  # the intent is written, the rename never happens
    intend = ledger.WriteLedger.intend
    def dying(self, *args, **kwargs):
        intend(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    ledger.WriteLedger.intend = dying
memory_tool(sys.argv[1], write_scope="ava:9").execute(
    {"action": "add", "text": "The sky is green."}
)
"""


@pytest.mark.parametrize("how", ["append", "replace"])
@pytest.mark.parametrize("when", ["after-rename", "before-rename"])
def test_a_writer_killed_mid_commit_leaves_its_write_applied_once(
    home: Path, when: str, how: str
) -> None:
    """A worker SIGKILLed between its durable write and its ledger answer (or just before the
    rename, or the append): the retried turn finds the intent it left, sees whether the write
    happened, and either answers from it (the write is not applied twice) or applies the
    write (it was never applied)."""
    ledger = home / ".locks" / "MEMORY.md.applied"
    ok = _run(home, "ava:1", {"action": "add", "text": "an earlier write"})  # a ledger exists
    assert ok[0].startswith("Added")
    done = subprocess.run(
        [sys.executable, "-c", _DIES_MID_COMMIT, str(home), when, how], check=False
    )
    assert done.returncode == -signal.SIGKILL
    assert ledger.read_text().splitlines()[-1].startswith('{"intent": [')
    before = (home / "MEMORY.md").read_text().count("The sky is green.")
    assert before == (1 if when == "after-rename" else 0)
    retry = _run(home, "ava:9", ADD)
    assert retry[0].startswith("Added an entry")
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 1
    kinds = [next(iter(json.loads(line))) for line in ledger.read_text().splitlines()]
    if when == "after-rename":  # finished by the retry, which is then answered from it
        assert kinds[-2:] == ["intent", "key"]
    else:  # voided, then applied by the retry
        assert kinds[-4:] == ["intent", "void", "intent", "key"]


_KILLED_BEFORE_FLUSH = """
import os, signal, sys
import workers.persona.writes as writes
from workers.persona.memory import memory_tool
writes.fdatasync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # appended, never flushed
memory_tool(sys.argv[1], write_scope="ava:9").execute(
    {"action": "add", "text": "The sky is green."}
)
"""


def test_an_append_its_writer_never_flushed_is_flushed_before_its_answer(home: Path) -> None:
    """A worker SIGKILLed between its append and its fdatasync: the entry is in the file (the
    page cache) but not on disk. The retry settles the intent: it flushes MEMORY.md before it
    records and returns the answer, and applies nothing twice."""
    _run(home, "ava:1", {"action": "add", "text": "an earlier write"})  # a ledger exists
    done = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_FLUSH, str(home)], check=False)
    assert done.returncode == -signal.SIGKILL
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 1
    flushed: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", fsync)
        retry = _run(home, "ava:9", ADD)
    assert retry[0].startswith("Added an entry")
    assert flushed[:2] == [str(home / "MEMORY.md"), str(home)]
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 1


def test_a_persons_append_after_a_writer_died_neither_repeats_nor_loses_its_entry(
    home: Path,
) -> None:
    """A worker SIGKILLed between its append and its answer, then a person appends a line
    (`echo >>`) before the retry: the intent finds the entry's bytes at the end it named, so
    the retry answers from it and the entry stays once (the file's size alone no longer
    matched, and the retry added it a second time)."""
    _run(home, "ava:1", {"action": "add", "text": "an earlier write"})
    done = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_FLUSH, str(home)], check=False)
    assert done.returncode == -signal.SIGKILL
    with (home / "MEMORY.md").open("a") as person:
        person.write("a line a person added\n")
    retry = _run(home, "ava:9", ADD)
    assert retry[0].startswith("Added an entry")
    text = (home / "MEMORY.md").read_text()
    assert text.count("The sky is green.") == 1
    assert text.endswith("- The sky is green.\na line a person added\n")


_KILLED_AFTER_REPLACED_ADD = """
import os, signal, sys
import workers.persona.memory_commit as commit
from workers.persona.memory import memory_tool
commit.append_bytes = lambda *args, **kwargs: False  # the add replaces (a page crossed, a link)
commit._record = lambda *_: os.kill(os.getpid(), signal.SIGKILL)  # written, not yet answered
memory_tool(sys.argv[1], write_scope="ava:9").execute(
    {"action": "add", "text": "The sky is green."}
)
"""


def test_a_replaced_add_is_found_by_its_bytes_too(home: Path) -> None:
    """An add that replaced the file (as one crossing a page does), its worker killed before
    the answer, then a person's `echo >>`: the intent names the added bytes as well, so the
    retry answers from it and the entry stays once."""
    _run(home, "ava:1", {"action": "add", "text": "an earlier write"})
    killed = [sys.executable, "-c", _KILLED_AFTER_REPLACED_ADD, str(home)]
    assert subprocess.run(killed, check=False).returncode == -signal.SIGKILL
    with (home / "MEMORY.md").open("a") as person:
        person.write("a line a person added\n")
    assert _run(home, "ava:9", ADD)[0].startswith("Added an entry")
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 1


def test_an_append_whose_settling_flush_fails_is_answered_as_applied_but_unflushed(
    home: Path,
) -> None:
    """The retry of a writer killed before its flush settles the intent, and that flush fails
    (EIO): the entry is in the file, so the retry hears it was changed and not to repeat it
    (an error), never "nothing was changed"; a later retry replays that answer, an error
    again; the entry stays once."""
    _run(home, "ava:1", {"action": "add", "text": "an earlier write"})
    done = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_FLUSH, str(home)], check=False)
    assert done.returncode == -signal.SIGKILL
    real = os.fsync

    def failing(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("MEMORY.md"):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", failing)
        retry = _run(home, "ava:9", ADD)[0]
    unflushed = "ERROR MEMORY.md was changed, but flushing it to disk failed (Input/output error)"
    assert retry.startswith(unflushed)
    assert _run(home, "ava:9", ADD)[0] == retry
    assert (home / "MEMORY.md").read_text().count("The sky is green.") == 1


_KILLED_AFTER_RENAME = """
import os, signal, sys
import workers.persona.memory_commit as commit
from workers.persona.memory import memory_tool
commit._record = lambda *_: os.kill(os.getpid(), signal.SIGKILL)  # renamed, not yet answered
memory_tool(sys.argv[1], write_scope="ava:9").execute({"action": "add", "text": "once"})
"""


def _pad_ledger_to(ledger: Path, size: int) -> None:
    """Other turns' answers appended to ``ledger`` until it is exactly ``size`` bytes."""
    lines = [ledger.read_bytes()]
    left = size - len(lines[0])
    overhead = len(answer_line(f"{0:032x}", ""))
    while left > 0:
        # 600-byte messages, then the rest split over two lines (each long enough to hold one)
        length = 600 if left >= 1300 else (left // 2 if left > 2 * overhead else left) - overhead
        lines.append(answer_line(f"{len(lines):032x}", "x" * length))
        left -= len(lines[-1])
    n = len(lines) - 1
    ledger.write_bytes(b"".join(lines))
    assert ledger.stat().st_size == size
    assert n < 2 * MAX_ENTRIES  # not compacted for its count


@pytest.mark.integration
def test_a_writer_killed_after_its_rename_is_finished_when_its_intent_crosses_the_bound(
    home: Path,
) -> None:
    """A ledger within a few bytes of what a holder reads of it: the intent line a writer
    appends before its rename does not take it past that bound (the ledger is compacted
    first), so when the writer dies after the rename the next holder reads the intent whole,
    records its answers, and the retried turn is answered from them: the entry lands once."""
    _run(home, "ava:1", {"action": "add", "text": "creates the ledger"})
    ledger = home / ".locks" / "MEMORY.md.applied"
    _pad_ledger_to(ledger, LEDGER_BOUND - 10)
    done = subprocess.run([sys.executable, "-c", _KILLED_AFTER_RENAME, str(home)], check=False)
    assert done.returncode == -signal.SIGKILL
    assert (home / "MEMORY.md").read_text().count("- once\n") == 1  # the rename happened
    assert ledger.stat().st_size <= LEDGER_BOUND
    retry = _run(home, "ava:9", _ONCE)
    assert retry[0].startswith("Added an entry to MEMORY.md"), retry
    assert (home / "MEMORY.md").read_text().count("- once\n") == 1

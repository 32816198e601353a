"""session_files.py: state files on disk, written atomically and read through the one door."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.support.rig import write_persona
from workers.persona.errors import PersonaFileError, PersonaNotFound
from workers.persona.messages import Message
from workers.persona.runner import run
from workers.persona.session import SessionState
from workers.persona.session_files import RETIRE_LIST_EVERY, SessionFiles, current_session


def _state(text: str) -> SessionState:
    messages = (Message("user", text), Message("assistant", "ok"))
    return SessionState("s1", "ava", 0, 1.0, 2.0, "soul", messages=messages, turns=1)


def test_first_write_makes_the_lane_directory_and_later_writes_reuse_it(tmp_path: Path) -> None:
    """The lane directory is made by the first write (and again if someone removed it)."""
    files = SessionFiles(tmp_path, "ava")
    first = files.write(_state("one"), "f1")
    assert (tmp_path / "sessions" / "ava" / first).is_file()
    shutil.rmtree(tmp_path / "sessions")
    second = files.write(_state("two"), "f2")
    state = files.read(second)
    assert state is not None
    assert state.messages[0].content == "two"


def test_write_refuses_a_lane_directory_leading_out(tmp_path: Path) -> None:
    """A sessions/ symlink leading out of the home is refused before anything is written, also
    when it appears after a first write (the check is per call)."""
    home = tmp_path / "ava"
    home.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    files = SessionFiles(home, "ava")
    files.write(_state("in"), "f1")
    shutil.rmtree(home / "sessions")
    (home / "sessions").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        files.write(_state("out"), "f2")
    assert list(outside.iterdir()) == []


def test_a_fifo_under_a_state_name_is_refused_not_blocked_on(tmp_path: Path) -> None:
    """Reading goes through read_prefix: a FIFO named like a state is "unreadable" at once
    (the turn starts a new session) instead of hanging the worker thread."""
    files = SessionFiles(tmp_path, "ava")
    (tmp_path / "sessions" / "ava").mkdir(parents=True)
    os.mkfifo(tmp_path / "sessions" / "ava" / "s1.f1.json")
    with capture_logs() as logs:
        assert files.read("s1.f1.json") is None
    assert [e["event"] for e in logs] == ["session.state_unreadable"]
    with capture_logs() as logs:
        assert files.read("s2.f1.json") is None
    assert [e["event"] for e in logs] == ["session.state_missing"]


def _names(home: Path) -> set[str]:
    return {p.name for p in (home / "sessions" / "ava").iterdir()}


def _files(home: Path, *names: str) -> SessionFiles:
    files = SessionFiles(home, "ava")
    for name in names:
        session, tag, _ = name.split(".")
        files.write(replace(_state(tag), id=session), tag)
    return files


def test_retire_keeps_the_newest_two_states_and_lists_nothing_between_consecutive_fences(
    tmp_path: Path,
) -> None:
    """Fence 7 over fence 6 of the same session: the state fence 6 was committed over (fence
    5's) goes by name, fence 6's stays for a reader that took the old pointer. No listing: a
    stray older state, which only a listing would find, is still there, and library files too."""
    files = _files(tmp_path, "s1.f2.json", "s1.f5.json", "s1.f6.json", "s1.f7.json",
                   "s1.l1a2b.json")  # fmt: skip
    assert files.retire("s1.f7.json", "s1.f6.json") == 1
    assert _names(tmp_path) == {"s1.f2.json", "s1.f6.json", "s1.f7.json", "s1.l1a2b.json"}


def test_retire_after_a_gap_lists_the_directory(tmp_path: Path) -> None:
    """Fence 9 over fence 6: the starts in between may have left states (a fenced-out turn, a
    crash after the write), so every fleet state but the two newest goes; library files stay."""
    files = _files(tmp_path, "s1.f5.json", "s1.f6.json", "s1.f7.json", "s1.f8.json",
                   "s1.f9.json", "s1.l1a2b.json")  # fmt: skip
    assert files.retire("s1.f9.json", "s1.f6.json") == 3
    assert _names(tmp_path) == {"s1.f6.json", "s1.f9.json", "s1.l1a2b.json"}


def test_retire_lists_when_the_guess_finds_nothing(tmp_path: Path) -> None:
    """Fence 6 started a new session over fence 5's state of another: the guessed name
    (``s1.f5``) is not there, so the directory is listed and ``s0.f5`` goes."""
    files = _files(tmp_path, "s0.f5.json", "s1.f6.json", "s1.f7.json")
    assert files.retire("s1.f7.json", "s1.f6.json") == 1
    assert _names(tmp_path) == {"s1.f6.json", "s1.f7.json"}


def test_retire_at_the_lanes_first_fences_lists(tmp_path: Path) -> None:
    """A lane's first commits list the directory (once or twice per lane): fence 1 has no
    previous state, and fence 2's guess (fence 0) finds nothing. So a lane whose Redis state
    was lost, and whose fences start again at 1, clears what its earlier life left at once."""
    files = _files(tmp_path, "s0.f7.json", "s0.f8.json", "s1.f1.json", "s1.l1a2b.json")
    assert files.retire("s1.f1.json", None) == 2
    assert _names(tmp_path) == {"s1.f1.json", "s1.l1a2b.json"}
    stray = _files(tmp_path, "s9.f5.json")  # from the lane's earlier life: written before
    os.utime(stray.directory / "s9.f5.json", (1.0, 1.0))
    _files(tmp_path, "s1.f2.json")
    assert files.retire("s1.f2.json", "s1.f1.json") == 1
    assert _names(tmp_path) == {"s1.f1.json", "s1.f2.json", "s1.l1a2b.json"}


def test_retire_lists_every_so_many_fences(tmp_path: Path) -> None:
    """Even between consecutive fences, a fence that is a multiple of RETIRE_LIST_EVERY lists,
    so a stray an earlier failed clean-up left behind does not stay for ever."""
    n = RETIRE_LIST_EVERY
    files = _files(tmp_path, "s1.f2.json", f"s1.f{n - 2}.json", f"s1.f{n - 1}.json",
                   f"s1.f{n}.json")  # fmt: skip
    assert files.retire(f"s1.f{n}.json", f"s1.f{n - 1}.json") == 2
    assert _names(tmp_path) == {f"s1.f{n - 1}.json", f"s1.f{n}.json"}


def test_a_home_renamed_mid_turn_is_not_brought_back(tmp_path: Path) -> None:
    """The persona directory is renamed (or deleted) while a turn runs: the turn's state write
    fails naming it, instead of making ``<old home>/sessions/<lane>/`` again as a stub that
    status would list as a persona and post would accept items for."""
    home = tmp_path / "ava"
    home.mkdir()
    files = SessionFiles(home, "ava")
    home.rename(tmp_path / "moved")
    with pytest.raises(PersonaNotFound):
        files.write(_state("hello"), "f1")
    assert not home.exists()


def test_a_library_cleanup_spares_a_state_another_process_committed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library twin: process A commits, process B (A's state as its base) writes and
    commits its own before A's cleanup runs; A's cleanup spares B's newer state, so CURRENT
    names a file that exists and the session holds both turns."""
    home = write_persona(tmp_path, "ava", "scripted:builtin", soul="You are ava.")
    original = SessionFiles.collect
    late: list[bool] = []

    def collect_late(self: SessionFiles, keep: set[str], **kwargs: Any) -> int:
        if not late:
            late.append(True)
            run(home, "process B's turn", session=True)
        return original(self, keep, **kwargs)

    monkeypatch.setattr(SessionFiles, "collect", collect_late)
    run(home, "process A's turn: my name is Bob", session=True)
    monkeypatch.setattr(SessionFiles, "collect", original)
    state = current_session(home, "ava")
    assert state is not None
    assert state.turns == 2

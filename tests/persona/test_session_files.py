"""session_files.py: state files on disk, written atomically and read through the one door."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from workers.persona.errors import PersonaFileError
from workers.persona.messages import Message
from workers.persona.session import SessionState
from workers.persona.session_files import SessionFiles


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

"""The memory tool resolves a target once and re-checks it per call (issue 15): whatever changed
on disk since, each write lands where a fresh resolution would put it, or is refused."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.memory import ok
from tests.support.persona import make_persona, tree
from workers.persona.errors import LockTimeout
from workers.persona.locks import LockMode, lock_file_for, path_lock
from workers.persona.memory import MemoryTool, memory_tool
from workers.persona.writes import fsync_directory


def _error(tool: MemoryTool, **arguments: Any) -> str:
    result = tool.execute(arguments)
    assert result.is_error, result.output
    return result.output


def test_memory_file_turned_into_a_symlink_leading_out_is_refused(
    tmp_path: Path, home: Path
) -> None:
    """After writes that resolved MEMORY.md, swapping it for a link outside is still refused."""
    outside = make_persona(tmp_path / "elsewhere", {"victim.md": "precious\n"})
    tool = memory_tool(home)
    ok(tool, action="add", text="first")
    (home / "MEMORY.md").unlink()
    (home / "MEMORY.md").symlink_to(outside / "victim.md")
    assert "outside the persona directory" in _error(tool, action="add", text="pwned")
    assert "outside the persona directory" in _error(tool, action="remove", text="precious")
    assert (outside / "victim.md").read_text() == "precious\n"
    assert tree(outside) == {"victim.md"}


@pytest.mark.parametrize("mode", ["local", "shared"])
def test_lock_dir_turned_into_a_symlink_leading_out_is_refused(
    tmp_path: Path, home: Path, mode: LockMode
) -> None:
    """A .locks replaced by a link outside after the first write gets no lock files out there."""
    outside = make_persona(tmp_path / "elsewhere")
    tool = memory_tool(home, lock_mode=mode)
    ok(tool, action="add", text="first")
    (home / ".locks").rename(tmp_path / "old-locks")
    (home / ".locks").symlink_to(outside, target_is_directory=True)
    assert "outside the persona directory" in _error(tool, action="add", text="second")
    assert tree(outside) == set()
    assert (home / "MEMORY.md").read_text() == "- first\n"


def test_notes_dir_turned_into_a_symlink_leading_out_is_refused(tmp_path: Path, home: Path) -> None:
    """memory/ replaced by a link outside after a note was written: the note add is refused."""
    outside = make_persona(tmp_path / "elsewhere", {"atlas.md": "precious\n"})
    tool = memory_tool(home, notes=True)
    ok(tool, action="add", target="note:atlas", text="first")
    (home / "memory").rename(tmp_path / "old-notes")
    (home / "memory").symlink_to(outside, target_is_directory=True)
    assert "outside the persona directory" in _error(
        tool, action="add", target="note:atlas", text="pwned"
    )
    assert (outside / "atlas.md").read_text() == "precious\n"


def test_persona_directory_replaced_is_written_where_it_is_now(tmp_path: Path, home: Path) -> None:
    """A persona directory moved away and recreated at the same path: writes go to the new one."""
    tool = memory_tool(home)
    ok(tool, action="add", text="old home")
    home.rename(tmp_path / "ava-old")
    make_persona(home, {"MEMORY.md": "- new home\n"})
    ok(tool, action="add", text="second")
    assert (home / "MEMORY.md").read_text() == "- new home\n- second\n"
    assert (tmp_path / "ava-old" / "MEMORY.md").read_text() == "- old home\n"
    assert (home / ".locks" / "MEMORY.md.lock").exists()


def test_persona_directory_gone_is_an_error_result(tmp_path: Path, home: Path) -> None:
    """After writes, a vanished persona directory is the same clear error as before any write."""
    tool = memory_tool(home)
    ok(tool, action="add", text="first")
    home.rename(tmp_path / "ava-old")
    assert "Nothing was changed" in _error(tool, action="add", text="second")
    assert not home.exists()


def test_removed_lock_dir_is_recreated(home: Path) -> None:
    """An operator who removes .locks between writes loses nothing: the next write recreates it."""
    tool = memory_tool(home)
    ok(tool, action="add", text="first")
    for path in sorted((home / ".locks").rglob("*"), reverse=True):
        path.unlink()
    (home / ".locks").rmdir()
    ok(tool, action="add", text="second")
    assert (home / "MEMORY.md").read_text() == "- first\n- second\n"
    assert (home / ".locks" / "MEMORY.md.lock").is_file()


def test_replace_of_a_deleted_file_is_not_found_after_writes(home: Path) -> None:
    """A file deleted after writes is reported missing by replace/remove, with no lock file made."""
    tool = memory_tool(home)
    ok(tool, action="add", text="first")
    (home / "MEMORY.md").unlink()
    assert "text not found" in _error(tool, action="remove", text="first")
    assert not (home / "MEMORY.md").exists()


@pytest.mark.parametrize("scope", [None, "turn-1"])
@pytest.mark.parametrize("mode", ["local", "shared"])
def test_a_write_is_durable_before_its_lock_is_let_go(
    home: Path, mode: LockMode, scope: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The add that creates MEMORY.md fsyncs its directory after the rename, the lock held;
    the next add appends and flushes the file, the lock held, with no directory fsync. With a
    write ledger, only the ledger's directory (it was just created) is fsynced after the lock.
    A spy around the real flushes, probing the lock from another thread (so the in-process
    gate is tested too)."""
    seen: list[tuple[Path, str, bool]] = []
    lock_file = lock_file_for(home, home.resolve() / "MEMORY.md", mode)

    def note(path: str | os.PathLike[str]) -> None:
        content = (home / "MEMORY.md").read_text() if (home / "MEMORY.md").exists() else ""
        free: list[bool] = []

        def probe() -> None:
            try:
                with path_lock(lock_file, mode=mode, timeout=0):
                    free.append(True)
            except LockTimeout:
                free.append(False)

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join(10)
        seen.append((Path(path), content, free == [True]))

    def spy(directory: str | os.PathLike[str]) -> None:
        note(directory)
        fsync_directory(directory)

    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        note(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    monkeypatch.setattr("workers.persona.memory.fsync_directory", spy)
    monkeypatch.setattr("workers.persona.writes.fsync_directory", spy)
    monkeypatch.setattr("workers.persona.memory_commit.fsync_directory", spy)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    tool = memory_tool(home, lock_mode=mode, write_scope=scope)
    ok(tool, action="add", text="flushed")
    real = home.resolve()
    created = [(real, "- flushed\n", False)]
    if scope is not None:
        created.append((real / ".locks", "- flushed\n", True))
        assert "Added an entry" in (home / ".locks" / "MEMORY.md.applied").read_text()
    assert seen == created
    seen.clear()
    ok(tool, action="add", text="appended")
    assert seen == [(real / "MEMORY.md", "- flushed\n- appended\n", False)]

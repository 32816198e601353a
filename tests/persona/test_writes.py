"""writes.py: atomic replacement and exclusive creation of persona files."""

from __future__ import annotations

import os
import random
import stat
import threading
from pathlib import Path

import pytest

from tests.support.persona import tree
from workers.persona.writes import (
    atomic_write_bytes,
    atomic_write_text,
    create_bytes,
    remove_stale_temps,
)


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    """The target ends up with exactly the new bytes and no temp file is left behind."""
    target = tmp_path / "MEMORY.md"
    atomic_write_text(target, "first ✓\n")
    assert target.read_bytes() == "first ✓\n".encode()
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert tree(tmp_path) == {"MEMORY.md"}


def test_atomic_write_keeps_permissions(tmp_path: Path) -> None:
    """Replacing a file keeps its permission bits."""
    target = tmp_path / "USER.md"
    target.write_text("x")
    target.chmod(0o600)
    atomic_write_text(target, "y")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_atomic_write_never_writes_through_a_hard_link(tmp_path: Path) -> None:
    """A hard link elsewhere keeps its old bytes: the write replaces the name, not the inode."""
    target = tmp_path / "MEMORY.md"
    target.write_text("old")
    other = tmp_path / "other"
    os.link(target, other)
    atomic_write_text(target, "new")
    assert (target.read_text(), other.read_text()) == ("new", "old")


def test_atomic_write_failure_leaves_no_temp(tmp_path: Path) -> None:
    """When the final rename fails, the error propagates and the temp file is removed."""
    (tmp_path / "MEMORY.md").mkdir()
    (tmp_path / "MEMORY.md" / "keep").write_text("k")
    with pytest.raises(OSError, match="directory"):
        atomic_write_text(tmp_path / "MEMORY.md", "x")
    assert tree(tmp_path) == {"MEMORY.md", "MEMORY.md/keep"}


def test_create_writes_a_new_file_and_its_directory_entry(tmp_path: Path) -> None:
    """A new name gets exactly the bytes, 0o644 (less the umask), and no temp file beside it."""
    target = tmp_path / "s1.f3.json"
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def counting(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", counting)
        create_bytes(target, b'{"id": "s1"}')
    assert target.read_bytes() == b'{"id": "s1"}'
    assert tree(tmp_path) == {"s1.f3.json"}
    assert len(fsyncs) == 2  # the file, then its directory
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_create_never_overwrites_or_follows(tmp_path: Path) -> None:
    """An existing file or a symlink (even a dangling one) under the name is FileExistsError,
    and neither it nor what it points to changes."""
    existing = tmp_path / "a.json"
    existing.write_text("keep")
    with pytest.raises(FileExistsError):
        create_bytes(existing, b"new")
    assert existing.read_text() == "keep"
    outside = tmp_path / "outside"
    link = tmp_path / "b.json"
    link.symlink_to(outside)
    with pytest.raises(FileExistsError):
        create_bytes(link, b"new")
    assert not outside.exists()


def test_create_in_a_missing_directory_is_file_not_found(tmp_path: Path) -> None:
    """The caller makes the directory (a lane's first state) and tries again."""
    with pytest.raises(FileNotFoundError):
        create_bytes(tmp_path / "sessions" / "ava" / "s1.f1.json", b"x")
    assert tree(tmp_path) == set()


def test_reader_never_sees_a_torn_file(tmp_path: Path) -> None:
    """While one thread rewrites a large file, every read sees one whole version or the other."""
    target = tmp_path / "MEMORY.md"
    versions = (b"a" * 1_000_000, b"b" * 1_500_000)
    atomic_write_bytes(target, versions[0])
    done = threading.Event()

    def writer() -> None:
        try:
            for round_ in range(60):
                atomic_write_bytes(target, versions[round_ % 2])
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    try:
        while not done.is_set() or reads == 0:
            assert target.read_bytes() in versions
            reads += 1
    finally:
        thread.join()
    assert reads > 0
    assert tree(tmp_path) == {"MEMORY.md"}


def test_a_temp_name_already_taken_is_skipped_never_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temp names are pseudo-random: one that exists (even a symlink) is never opened; the
    writer draws another name, and the file in the way is left exactly as it was."""
    target = tmp_path / "MEMORY.md"
    taken = tmp_path / f".MEMORY.md.{0xAB:016x}.tmp"
    taken.symlink_to(tmp_path / "elsewhere")
    draws = iter([0xAB, 0xAB, 0xCD])
    monkeypatch.setattr(random, "getrandbits", lambda bits: next(draws))
    atomic_write_bytes(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert taken.is_symlink()
    assert not (tmp_path / "elsewhere").exists()
    assert next(draws, None) is None  # two taken draws skipped, the third used


def test_a_writer_that_only_draws_taken_names_fails_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a few taken names in a row the write fails with FileExistsError, writing nothing."""
    (tmp_path / f".MEMORY.md.{0xAB:016x}.tmp").write_bytes(b"someone's")
    monkeypatch.setattr(random, "getrandbits", lambda bits: 0xAB)
    with pytest.raises(FileExistsError):
        atomic_write_bytes(tmp_path / "MEMORY.md", b"new\n")
    assert not (tmp_path / "MEMORY.md").exists()


def test_a_stale_temp_this_writer_may_not_remove_never_stops_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed writer's temp file owned by someone else (EPERM on unlink, as in a sticky
    directory) is left where it is; the write itself goes ahead."""
    foreign = tmp_path / f".MEMORY.md.{0xEE:016x}.tmp"
    foreign.write_bytes(b"another user's")
    real_unlink = os.unlink

    def unlink(path: str, *args: object, **kwargs: object) -> None:
        if os.fspath(path) == str(foreign):
            raise PermissionError(1, "Operation not permitted", str(path))
        real_unlink(path)

    monkeypatch.setattr(os, "unlink", unlink)
    assert remove_stale_temps(tmp_path / "MEMORY.md") == []
    atomic_write_bytes(tmp_path / "MEMORY.md", b"new\n")
    assert (tmp_path / "MEMORY.md").read_bytes() == b"new\n"
    assert foreign.read_bytes() == b"another user's"

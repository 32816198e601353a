"""workers/persona/storage.py: a persona filesystem that is full or read-only refuses a turn
before its model call, as a transient failure naming the directory, on real filesystems (a
small tmpfs: see tests/support/tmpfs.py)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.tmpfs import fill, remount, tmpfs
from workers.persona import storage
from workers.persona.errors import PersonaFileError, StorageUnavailable, failure_kind


def test_a_roomy_writable_home_passes_and_the_probe_leaves_nothing(tmp_path: Path) -> None:
    """The check and its test write succeed on an ordinary directory, which keeps no file."""
    storage.check(tmp_path)
    storage.check(tmp_path, probe=True)
    assert list(tmp_path.iterdir()) == []


def test_a_home_that_is_gone_is_left_to_the_turn(tmp_path: Path) -> None:
    """statvfs of a missing home raises nothing here: the turn reports a missing persona as it
    always did (permanent), not as storage trouble (transient)."""
    storage.check(tmp_path / "gone", probe=True)


def test_a_nearly_full_filesystem_refuses_with_its_free_bytes(tmp_path: Path) -> None:
    """Under MIN_FREE_BYTES free: refused, naming the home and what is free, marked as a
    storage failure (the next attempt probes) and transient (it retries, spending no attempt)."""
    with tmpfs(tmp_path / "mnt", "2m") as home:
        storage.check(home)
        fill(home, leave=storage.MIN_FREE_BYTES // 2)
        with pytest.raises(StorageUnavailable) as caught:
            storage.check(home)
    message = str(caught.value)
    assert message.startswith(f"{storage.STORAGE_MARK} at {home}: ")
    assert "bytes free on its filesystem" in message
    assert "Free space on that filesystem" in message
    assert failure_kind(caught.value) == "transient"


def test_a_read_only_filesystem_refuses(tmp_path: Path) -> None:
    """A home on a read-only mount is refused before anything is written."""
    with tmpfs(tmp_path / "mnt", "2m") as home:
        remount(home, "ro")
        with pytest.raises(StorageUnavailable, match="mounted read-only"):
            storage.check(home)


def test_the_probe_finds_a_write_the_filesystem_refuses(tmp_path: Path) -> None:
    """What statvfs cannot see (a quota; here a tmpfs with no block left): the test write is
    refused, reported as storage trouble, and its file removed."""
    with tmpfs(tmp_path / "mnt", "1m") as home:
        fill(home, leave=0)
        with pytest.raises(StorageUnavailable, match="a test write was refused"):
            storage._probe(str(home))
        assert [path.name for path in home.iterdir()] == ["filler"]


def test_a_failure_caused_by_a_full_disk_is_described_as_storage() -> None:
    """An ENOSPC/EDQUOT/EROFS/EACCES/EPERM anywhere in a failure's causes gives the storage
    message (naming the file when the error does; a wrong owner dead-lettered the lane after 5
    quick attempts); any other failure gives None."""
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/p/ava/sessions/x.json")
    try:
        raise RuntimeError("commit failed") from full
    except RuntimeError as wrapped:
        message = storage.failure_message("/p/ava", wrapped, "saving the turn")
    assert message is not None
    assert message.startswith(f"{storage.STORAGE_MARK} at /p/ava: No space left on device")
    assert "while saving the turn (/p/ava/sessions/x.json)" in message
    denied = storage.failure_message("/p/ava", OSError(errno.EACCES, "Permission denied"), "x")
    assert denied is not None
    assert denied.startswith(f"{storage.STORAGE_MARK} at /p/ava: Permission denied while x;")
    assert denied.endswith("Give the worker's user write access to the persona directory (its "
                           "owner and mode: `ls -ln` it beside a working persona's)")  # fmt: skip
    assert "remount" not in denied
    assert failure_kind(OSError(errno.EPERM, "not permitted")) == "transient"
    assert storage.failure_message("/p/ava", OSError(errno.EIO, "I/O error"), "x") is None
    # An unreadable SOUL.md: its PersonaFileError decides (permanent), not the EACCES behind.
    unreadable = PersonaFileError("/p/ava/SOUL.md", "cannot be read")
    unreadable.__context__ = OSError(errno.EACCES, "Permission denied", "/p/ava/SOUL.md")
    assert storage.failure_message("/p/ava", unreadable, "x") is None
    assert failure_kind(unreadable) == "permanent"
    assert failure_kind(OSError(errno.EROFS, "read-only")) == "transient"
    assert failure_kind(OSError(errno.EDQUOT, "quota")) == "transient"
    assert failure_kind(OSError(errno.EIO, "I/O error")) == "unknown"


def test_a_filesystem_out_of_inodes_refuses_though_it_has_bytes_free(tmp_path: Path) -> None:
    """Bytes to spare but (almost) no inode left: no file a turn creates could be made, so the
    turn is refused before its call, naming the free inodes."""
    home = tmp_path / "mnt"
    with tmpfs(home, "4m,nr_inodes=64"):
        storage.check(home)
        for n in range(64):
            try:
                (home / f"f{n}").touch()
            except OSError:
                break
        with pytest.raises(StorageUnavailable, match="free inodes on its filesystem"):
            storage.check(home)


def test_the_probe_also_writes_in_the_lanes_own_directories(tmp_path: Path) -> None:
    """A lane's sessions/<lane> that refuses writes (immutable here: EPERM even for root; a
    wrong owner gives EACCES) while the home takes them: the probe finds it, so the retry is
    refused before its model call (each retry paid a call whose answer could not be kept)."""
    home = tmp_path / "ava"
    lane_dir = home / "sessions" / "ava"
    lane_dir.mkdir(parents=True)
    subprocess.run(["chattr", "+i", str(lane_dir)], check=True)
    try:
        storage.check(home, probe=True)  # the home alone takes a write
        with pytest.raises(StorageUnavailable, match="Operation not permitted"):
            storage.check(home, probe=True, within=("sessions/ava", "transcripts/ava"))
    finally:
        subprocess.run(["chattr", "-i", str(lane_dir)], check=True)
    storage.check(home, probe=True, within=("sessions/ava", "transcripts/ava"))
    assert sorted(path.name for path in lane_dir.iterdir()) == []


def test_the_probe_never_writes_outside_the_home(tmp_path: Path) -> None:
    """A home whose sessions/ is a symlink to a directory elsewhere: the probe of the lane's
    directory is skipped (it wrote there, and reported that filesystem's refusal as the
    persona's)."""
    home = tmp_path / "ava"
    home.mkdir()
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "ava").mkdir(parents=True)
    (home / "sessions").symlink_to(elsewhere)
    subprocess.run(["chattr", "+i", str(elsewhere / "ava")], check=True)
    try:
        storage.check(home, probe=True, within=("sessions/ava",))
    finally:
        subprocess.run(["chattr", "-i", str(elsewhere / "ava")], check=True)

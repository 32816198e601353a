"""filesystems.py: which filesystems count as this machine's own."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from workers.persona import filesystems
from workers.persona.filesystems import is_local, mounts

_MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
31 27 0:44 / /personas rw,relatime shared:9 master:3 - nfs4 server:/export rw,vers=4.2
32 27 0:45 / /var/lib/docker/x rw - overlay overlay rw,lowerdir=/a:/b
33 27 0:46 / /odd rw
34 27 0:47 /@home /home/my\\040files rw shared:2 - btrfs /dev/vda2 rw,subvol=/@home
35 31 0:48 / /personas/local rw - tmpfs tmpfs rw
36 31 0:49 / /personas/local rw - nfs server:/other rw
"""


def test_the_mount_table_names_each_mounts_device_point_and_filesystem() -> None:
    """Optional fields before the " - " separator are skipped, escaped spaces in mount points
    read back, and a line without a separator is ignored."""
    assert mounts(_MOUNTINFO)[:3] == [
        ("0:21", "/proc", "proc"),
        ("254:1", "/", "ext4"),
        ("0:44", "/personas", "nfs4"),
    ]
    assert ("0:47", "/home/my files", "btrfs") in mounts(_MOUNTINFO)
    assert all(device != "0:46" for device, _, _ in mounts(_MOUNTINFO))


@pytest.fixture
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(_MOUNTINFO)
    monkeypatch.setattr(filesystems, "_MOUNTINFO", str(mountinfo))
    monkeypatch.setattr(filesystems, "_known", {})


@pytest.mark.parametrize(
    ("device", "path", "local"),
    [
        ((254, 1), "/srv/p/MEMORY.md", True),
        ((0, 45), "/var/lib/docker/x/MEMORY.md", True),
        ((0, 44), "/personas/ava/MEMORY.md", False),
        ((0, 21), "/proc/x", False),
        # a device the table does not name (a btrfs subvolume's): the mount over its path
        ((0, 99), "/home/my files/ava/MEMORY.md", True),
        ((0, 99), "/personas/ava/MEMORY.md", False),
        ((0, 99), "/personas/local/ava/MEMORY.md", False),  # the last mount over a point wins
        ((0, 99), "/personasX/MEMORY.md", True),  # not under /personas: under /
    ],
)
@pytest.mark.usefixtures("table")
def test_only_known_local_filesystems_count_as_local(
    device: tuple[int, int], path: str, local: bool
) -> None:
    """ext4, a container's overlay and btrfs are local; NFS and anything unknown are not (the
    memory tool then replaces, as it always did)."""
    assert is_local(os.makedev(*device), path) is local


def test_an_answer_is_kept_a_minute_per_device(
    table: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within the minute the table is not read again; after it, a device number a new mount
    took is judged afresh."""
    nfs = os.makedev(0, 44)
    assert not is_local(nfs, "/personas/ava/MEMORY.md")
    filesystems._known[nfs] = (filesystems._known[nfs][0], True)
    assert is_local(nfs, "/personas/ava/MEMORY.md")
    now = filesystems._known[nfs][0] + 61
    monkeypatch.setattr(time, "monotonic", lambda: now)
    assert not is_local(nfs, "/personas/ava/MEMORY.md")


def test_without_a_mount_table_nothing_is_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filesystems, "_MOUNTINFO", "/nonexistent/mountinfo")
    monkeypatch.setattr(filesystems, "_known", {})
    here = tempfile.gettempdir()
    assert not is_local(os.stat(here).st_dev, here)


def test_this_machines_temp_directory_is_local() -> None:
    """The disk the tests write to (ext4, xfs, btrfs, overlay or tmpfs on any machine CI runs
    on): the memory tests' appends run here."""
    here = tempfile.gettempdir()
    assert is_local(os.stat(here).st_dev, here)

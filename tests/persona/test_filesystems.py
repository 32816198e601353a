"""filesystems.py: which filesystems count as this machine's own."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from workers.persona import filesystems
from workers.persona.filesystems import is_local, kinds_by_device

_MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
31 27 0:44 / /personas rw,relatime shared:9 master:3 - nfs4 server:/export rw,vers=4.2
32 27 0:45 / /var/lib/docker/x rw - overlay overlay rw,lowerdir=/a:/b
33 27 0:46 / /odd rw
"""


def test_mountinfo_names_each_devices_filesystem() -> None:
    """Optional fields before the " - " separator are skipped; a line without one is
    ignored."""
    assert kinds_by_device(_MOUNTINFO) == {
        "0:21": "proc",
        "254:1": "ext4",
        "0:44": "nfs4",
        "0:45": "overlay",
    }


@pytest.mark.parametrize(
    ("device", "local"),
    [((254, 1), True), ((0, 45), True), ((0, 44), False), ((0, 21), False), ((9, 9), False)],
)
def test_only_known_local_filesystems_count_as_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: tuple[int, int], local: bool
) -> None:
    """ext4 and a container's overlay are local; NFS, anything unknown and a device the
    mount table does not name are not (the memory tool then replaces, as it always did)."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(_MOUNTINFO)
    monkeypatch.setattr(filesystems, "_MOUNTINFO", str(mountinfo))
    monkeypatch.setattr(filesystems, "_known", {})
    assert is_local(os.makedev(*device)) is local


def test_without_a_mount_table_nothing_is_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filesystems, "_MOUNTINFO", "/nonexistent/mountinfo")
    monkeypatch.setattr(filesystems, "_known", {})
    assert not is_local(os.stat(tempfile.gettempdir()).st_dev)


def test_this_machines_temp_directory_is_local() -> None:
    """The disk the tests write to (ext4, xfs, overlay or tmpfs on any machine CI runs on)."""
    assert is_local(os.stat(tempfile.gettempdir()).st_dev)

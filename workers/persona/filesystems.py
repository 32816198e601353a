"""Filesystems: whether a file lives on a disk of this machine's own, or on one it shares.

Why it matters (issue 15): a memory ``add`` appends in place (:func:`~workers.persona.writes.
append_bytes`) only where this kernel is the only one that caches the file's pages. A client of
a network filesystem (NFS, CIFS, ...) that is cut off from its server keeps an append it has not
flushed, also after its process was killed, and writes it back when it reaches the server
again: by then another host, holding the lock the dead process lost, may have written its own
entries at that offset, and the late write would land on them. A replace is safe there (the
late bytes go to a temp file already removed), so on anything not known to be local the
memory tool replaces, as it always did.

Known local: the filesystems of a disk or of memory (ext2/3/4, xfs, btrfs, f2fs, zfs,
bcachefs, jfs, reiserfs, tmpfs, ramfs) and a container's overlay. Anything else, or a machine
without ``/proc/self/mountinfo``, counts as shared. A file's device is looked up in the mount
table; one the table does not name (a btrfs subvolume reports a device of its own) by the
mount its path is under. An answer is kept for a minute per device (a device number can be
reused by a later mount).
"""

from __future__ import annotations

import os
import re
import time

__all__ = ["LOCAL_KINDS", "Mount", "is_local", "mounts"]

LOCAL_KINDS = frozenset(
    {
        "bcachefs", "btrfs", "ext2", "ext3", "ext4", "f2fs", "jfs", "overlay", "ramfs",
        "reiserfs", "tmpfs", "xfs", "zfs",
    }
)  # fmt: skip
_MOUNTINFO = "/proc/self/mountinfo"
#: Seconds an answer is kept per device.
_KEEP = 60.0
_ESCAPED = re.compile(r"\\([0-7]{3})")

_known: dict[int, tuple[float, bool]] = {}

Mount = tuple[str, str, str]  # (device "major:minor", mount point, filesystem type)


def mounts(mountinfo: str) -> list[Mount]:
    """The mounts of ``/proc/self/mountinfo``'s text, mount points unescaped."""
    found: list[Mount] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if after:
            point = _ESCAPED.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            found.append((fields[2], point, after[0]))
    return found


def is_local(device: int, path: str) -> bool:
    """Whether ``path``, on ``device`` (its ``st_dev``), is on a filesystem only this machine
    writes to."""
    now = time.monotonic()
    known = _known.get(device)
    if known is not None and now - known[0] < _KEEP:
        return known[1]
    try:
        with open(_MOUNTINFO, encoding="utf-8", errors="replace") as table:
            found = mounts(table.read())
    except OSError:
        found = []
    local = _kind(found, device, path) in LOCAL_KINDS
    _known[device] = (now, local)
    return local


def _kind(found: list[Mount], device: int, path: str) -> str:
    number = f"{os.major(device)}:{os.minor(device)}"
    for mount_device, _, kind in found:
        if mount_device == number:
            return kind
    real = os.path.realpath(path)
    best, longest = "", -1
    for _, point, kind in found:  # the deepest mount over the path; of equal ones, the last
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= longest:
            best, longest = kind, len(point)
    return best

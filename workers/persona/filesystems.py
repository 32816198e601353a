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
without ``/proc/self/mountinfo``, counts as shared.
"""

from __future__ import annotations

import os
import threading

__all__ = ["LOCAL_KINDS", "is_local", "kinds_by_device"]

LOCAL_KINDS = frozenset(
    {
        "bcachefs", "btrfs", "ext2", "ext3", "ext4", "f2fs", "jfs", "overlay", "ramfs",
        "reiserfs", "tmpfs", "xfs", "zfs",
    }
)  # fmt: skip
_MOUNTINFO = "/proc/self/mountinfo"

_known: dict[int, bool] = {}
_guard = threading.Lock()


def kinds_by_device(mountinfo: str) -> dict[str, str]:
    """``"major:minor"`` -> filesystem type, from the text of ``/proc/self/mountinfo``."""
    found: dict[str, str] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 3:
            continue
        after = line.split(" - ", 1)[1].split()
        if after:
            found.setdefault(fields[2], after[0])
    return found


def is_local(device: int) -> bool:
    """Whether ``device`` (a ``st_dev``) is a filesystem only this machine writes to. Read
    once per device and process (mounts do not change under a running file)."""
    known = _known.get(device)
    if known is not None:
        return known
    try:
        with open(_MOUNTINFO, encoding="utf-8", errors="replace") as mounts:
            kinds = kinds_by_device(mounts.read())
    except OSError:
        kinds = {}
    kind = kinds.get(f"{os.major(device)}:{os.minor(device)}", "")
    local = kind in LOCAL_KINDS
    with _guard:
        _known[device] = local
    return local

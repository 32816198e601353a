"""A small real tmpfs for tests of full and read-only persona filesystems (needs the right to
mount, which CI's root has): the only way to make a real filesystem run out of space or turn
read-only under a persona without filling or remounting the machine's own disks."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["fill", "remount", "tmpfs"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """Mount a ``size`` tmpfs at ``where`` (created) for the ``with`` body; lazily unmounted
    after it, so a process still inside cannot hold it. Skips the test where mounting is not
    allowed (not root): the behaviour is then untestable here, not passing."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        _run("umount", "-l", str(where))


def remount(where: Path, mode: str) -> None:
    """Remount the tmpfs at ``where`` ``ro`` or ``rw``."""
    done = _run("mount", "-o", f"remount,{mode}", str(where))
    assert done.returncode == 0, done.stderr


def fill(where: Path, leave: int) -> Path:
    """Write a filler file into ``where`` until about ``leave`` bytes stay free."""
    info = os.statvfs(where)
    filler = where / "filler"
    with filler.open("wb") as out:
        out.write(b"\0" * max(0, info.f_bavail * info.f_frsize - leave))
    return filler

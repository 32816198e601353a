"""reaper.py: the background deleter behind transcript pruning."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

from structlog.testing import capture_logs

from workers.persona.reaper import Reaper


def test_deletes_in_the_background_and_reports_each_file(tmp_path: Path) -> None:
    """delete() returns before the unlink; the path counts as pending until on_done ran; a file
    already gone is fine; wait() returns once all is done."""
    release = threading.Event()
    done: list[tuple[str, bool]] = []

    def on_done(path: str, ok: bool) -> None:
        release.wait(10)
        done.append((path, ok))

    reaper = Reaper("test-reaper", on_done=on_done)
    files = [tmp_path / f"f{n}" for n in range(3)]
    for file in files:
        file.write_bytes(b"x" * 5000)
    reaper.delete([str(f) for f in files] + [str(tmp_path / "never-existed")])
    assert str(files[2]) in reaper  # the thread is held in the first callback
    assert not reaper.wait(0.05)
    release.set()
    assert reaper.wait(10)
    assert not any(f.exists() for f in files)
    assert done == [(str(f), True) for f in files] + [(str(tmp_path / "never-existed"), True)]
    assert str(files[0]) not in reaper


def test_a_failed_unlink_is_logged_and_reported(tmp_path: Path) -> None:
    """A path that cannot be unlinked (here a directory) is logged and on_done gets ok=False."""
    done: list[tuple[str, bool]] = []
    reaper = Reaper("test-reaper", on_done=lambda path, ok: done.append((path, ok)))
    (tmp_path / "adir").mkdir()
    with capture_logs() as logs:
        reaper.delete([str(tmp_path / "adir")])
        assert reaper.wait(10)
    assert done == [(str(tmp_path / "adir"), False)]
    assert [e["event"] for e in logs] == ["reaper.delete_failed"]
    assert (tmp_path / "adir").is_dir()


def _child(path: str) -> None:
    reaper = _SHARED
    reaper.delete([path])
    raise SystemExit(0 if reaper.wait(10) else 3)


_SHARED = Reaper("test-shared-reaper")


def test_a_forked_child_gets_a_working_reaper(tmp_path: Path) -> None:
    """After fork the child's reaper starts empty and runs its own thread."""
    first, second = tmp_path / "parent", tmp_path / "child"
    first.write_text("p")
    second.write_text("c")
    _SHARED.delete([str(first)])  # the parent's thread exists before the fork
    assert _SHARED.wait(10)
    child = multiprocessing.get_context("fork").Process(target=_child, args=(str(second),))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert not first.exists()
    assert not second.exists()

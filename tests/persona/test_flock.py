"""flock.py: local-mode locks on a descriptor kept open per process (issue 15).

What keeping the descriptor open could break, and each test pins it: a forked child must not
share the parent's hold; a lock file removed and recreated must not leave two holders.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.memory import held_by_child
from workers.persona.errors import LockTimeout
from workers.persona.flock import MAX_OPEN
from workers.persona.locks import path_lock

_HOLDER = """
import sys
from workers.persona.locks import path_lock
with path_lock(sys.argv[1], mode="local", timeout=30):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _child_result(lock_file: Path) -> int:
    """Fork while this process holds ``lock_file``; the child tries it: 0 timed out, 1 got it."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 2
        try:
            with path_lock(lock_file, mode="local", timeout=0.2):
                code = 1
        except LockTimeout:
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork in a threaded pytest
def test_forked_child_does_not_share_the_parents_hold(tmp_path: Path) -> None:
    """A child forked while its parent holds the lock waits for it like any other process."""
    lock_file = tmp_path / "MEMORY.md.lock"
    with path_lock(lock_file, mode="local", timeout=5):
        assert _child_result(lock_file) == 0
    assert _child_result(lock_file) == 1


def test_lock_file_removed_and_recreated_still_excludes(tmp_path: Path) -> None:
    """This process locked the old inode; after the file is removed and another process holds
    the new one, this process must wait for it, not lock the old inode it still has open."""
    lock_file = tmp_path / "MEMORY.md.lock"
    with path_lock(lock_file, mode="local", timeout=5):
        pass
    lock_file.unlink()
    with (
        held_by_child(_HOLDER, str(lock_file)),
        pytest.raises(LockTimeout),
        path_lock(lock_file, mode="local", timeout=0.3),
    ):
        pass
    with path_lock(lock_file, mode="local", timeout=5):
        pass


def test_lock_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    """The lock file is opened without following a symlink put at its name."""
    (tmp_path / "elsewhere").write_text("")
    lock_file = tmp_path / "MEMORY.md.lock"
    lock_file.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="symbolic links") as raised, path_lock(lock_file, timeout=1):
        pass
    assert raised.value.errno == errno.ELOOP


_TRY = """
import sys
from workers.persona.errors import LockTimeout
from workers.persona.flock import MAX_OPEN
from workers.persona.locks import path_lock
try:
    with path_lock(sys.argv[1], mode="local", timeout=0.2):
        print("got it")
except LockTimeout:
    print("timed out")
"""


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_descriptors_are_bounded_and_a_held_lock_keeps_its_own(tmp_path: Path) -> None:
    """Locking many files keeps at most MAX_OPEN descriptors open, and never closes the one
    under a lock that is held (closing it would release the lock)."""
    held = tmp_path / "held.lock"
    before = _open_descriptors()
    with path_lock(held, mode="local", timeout=5):
        for index in range(3 * MAX_OPEN):
            with path_lock(tmp_path / f"other-{index}.lock", mode="local", timeout=5):
                pass
        assert _open_descriptors() - before <= MAX_OPEN
        other = subprocess.run(
            [sys.executable, "-c", _TRY, str(held)], capture_output=True, text=True, check=True
        )
        assert other.stdout.strip() == "timed out"
    other = subprocess.run(
        [sys.executable, "-c", _TRY, str(held)], capture_output=True, text=True, check=True
    )
    assert other.stdout.strip() == "got it"


def test_a_waiter_served_while_it_slept_does_not_take_the_freed_lock(tmp_path: Path) -> None:
    """A writer whose queued write was applied while it waited (``settled``) must not take
    the lock once it is free: it would only hold up the writers still waiting (issue 15).
    The body runs without the lock and gets False."""
    lock = tmp_path / "MEMORY.md.lock"
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with path_lock(lock, mode="local", timeout=5):
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(10)
    served: list[bool] = []

    def queue_and_get_served() -> None:
        served.append(True)  # the holder applied this writer's write...
        release.set()
        holder.join(10)  # ...and let go of the lock before the writer looks again

    with path_lock(
        lock, mode="local", timeout=5, contended=queue_and_get_served,
        settled=lambda: bool(served),
    ) as held:  # fmt: skip
        pass
    assert held is False

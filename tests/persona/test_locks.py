"""locks.py: sidecar lock layout, exclusion across threads and processes, crashes, observers."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.memory import held_by_child
from tests.support.persona import make_persona
from workers.persona.errors import LockTimeout, PersonaFileError
from workers.persona.locks import (
    LockMode,
    break_shared_lock,
    lock_file_for,
    path_lock,
    set_lock_wait_observer,
    shared_claims_under,
    shared_lock_holders,
)

MODES: tuple[LockMode, ...] = ("local", "shared")

_HOLDER = """
import os, signal, socket, sys
if len(sys.argv) > 4:  # pretend to run on another machine: its host name and kernel
    socket.gethostname = lambda: sys.argv[4]
    import workers.persona.owners
    workers.persona.owners.boot_id = lambda: 0x1234
from workers.persona.locks import path_lock
with path_lock(sys.argv[1], mode=sys.argv[2], timeout=30):
    print("held", os.getpid(), flush=True)
    if sys.argv[3] == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.readline()
print("released", flush=True)
"""


@pytest.fixture
def observed() -> Iterator[list[float]]:
    """Waits reported to the lock-wait observer during the test."""
    waits: list[float] = []
    set_lock_wait_observer(waits.append)
    try:
        yield waits
    finally:
        set_lock_wait_observer(None)


def _hold(
    lock_file: Path, mode: str, how: str, host: str | None = None
) -> tuple[subprocess.Popen[str], int]:
    """Start a process that holds the lock; returns it once it reports holding, with its pid.
    ``host`` makes its claim say it runs on another host."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(lock_file), mode, how, *([host] if host else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    line = holder.stdout.readline().split()
    assert line[0] == "held", line
    return holder, int(line[1])


def test_lock_file_layout(tmp_path: Path) -> None:
    """Lock files mirror the data path under .locks/, one suffix per mode, never the data file."""
    root = make_persona(tmp_path / "ava").resolve()
    assert lock_file_for(root, root / "MEMORY.md") == root / ".locks" / "MEMORY.md.lock"
    shared = lock_file_for(root, root / "MEMORY.md", "shared")
    assert shared == root / ".locks" / "MEMORY.md.claim"
    note = lock_file_for(root, root / "memory" / "ideas.md")
    assert note == root / ".locks" / "memory" / "ideas.md.lock"
    assert note.parent.is_dir()
    assert not (root / "memory").exists()


def test_lock_dir_symlink_leading_out_is_refused(tmp_path: Path) -> None:
    """A .locks that links outside the persona directory is refused: no lock files out there."""
    outside = make_persona(tmp_path / "outside")
    root = make_persona(tmp_path / "ava").resolve()
    (root / ".locks").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PersonaFileError, match="outside the persona directory"):
        lock_file_for(root, root / "MEMORY.md")
    assert list(outside.iterdir()) == []


def test_bad_mode_is_refused(tmp_path: Path) -> None:
    """A lock mode other than local or shared is a ValueError."""
    with pytest.raises(ValueError, match="lock mode"), path_lock(tmp_path / "x.lock", mode="nfs"):  # type: ignore[arg-type]
        pass


@pytest.mark.parametrize("mode", MODES)
def test_other_process_excludes_until_release(tmp_path: Path, mode: LockMode) -> None:
    """While another process holds the lock, acquiring times out; after release it succeeds."""
    lock_file = tmp_path / "MEMORY.md.lock"
    holder, _ = _hold(lock_file, mode, "wait")
    try:
        with pytest.raises(LockTimeout) as raised, path_lock(lock_file, mode=mode, timeout=0.2):
            pass
        assert raised.value.path == lock_file
        assert raised.value.timeout == 0.2
        assert str(lock_file) in str(raised.value)
        assert f"within 0.2s ({mode} lock mode" in str(raised.value)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(30)
    with path_lock(lock_file, mode=mode, timeout=5):
        pass


def test_local_lock_is_released_when_its_holder_dies(tmp_path: Path) -> None:
    """local mode: a SIGKILLed holder's flock is released by the kernel at once."""
    lock_file = tmp_path / "MEMORY.md.lock"
    holder, _ = _hold(lock_file, "local", "crash")
    assert holder.wait(30) != 0
    with path_lock(lock_file, mode="local", timeout=5):
        pass


def test_shared_lock_of_a_dead_holder_on_this_host_is_broken_automatically(
    tmp_path: Path,
) -> None:
    """shared mode: a writer SIGKILLed while holding the lock leaves its claim; the next writer
    on this host sees the holder's process is gone, breaks the claim and gets the lock.
    (Changed by issue 10: it used to block every later write until an operator cleared it.)"""
    lock_file = tmp_path / "MEMORY.md.shared.lock"
    holder, pid = _hold(lock_file, "shared", "crash")
    assert holder.wait(30) != 0
    assert any(f"pid {pid}" in claim for claim in shared_lock_holders(lock_file))
    with path_lock(lock_file, mode="shared", timeout=10):
        mine = shared_lock_holders(lock_file)
        assert mine
        assert all(f"pid {pid} " not in claim for claim in mine)
    assert shared_lock_holders(lock_file) == ()


@pytest.mark.integration
def test_shared_lock_of_a_dead_holder_on_another_host_stays_and_is_named(tmp_path: Path) -> None:
    """A claim recorded by another host is never broken from here (its processes cannot be
    seen): the write times out naming the claim, until break_shared_lock clears it."""
    lock_file = tmp_path / "MEMORY.md.shared.lock"
    holder, pid = _hold(lock_file, "shared", "crash", host="otherhost")
    assert holder.wait(30) != 0
    with pytest.raises(LockTimeout) as raised, path_lock(lock_file, mode="shared", timeout=1.2):
        pass
    assert any(f"held claim by pid {pid} on otherhost" in claim for claim in raised.value.holders)
    assert f"pid {pid}" in str(raised.value)
    assert shared_claims_under(tmp_path) == []  # not under a .locks dir: see the status test
    removed = break_shared_lock(lock_file)
    assert any(f"pid {pid}" in claim for claim in removed)
    with path_lock(lock_file, mode="shared", timeout=5):
        assert shared_lock_holders(lock_file)  # our own claim, while we hold it
    assert shared_lock_holders(lock_file) == ()


def test_shared_claims_under_a_persona_name_the_file_and_holder(tmp_path: Path) -> None:
    """shared_claims_under lists every claim under <persona>/.locks with its data file."""
    home = make_persona(tmp_path / "ava")
    lock_file = lock_file_for(home, home / "MEMORY.md", "shared")
    holder, pid = _hold(lock_file, "shared", "crash", host="otherhost")
    assert holder.wait(30) != 0
    claims = shared_claims_under(home)
    assert ("MEMORY.md", f"held claim by pid {pid} on otherhost") in claims


@pytest.mark.parametrize("mode", MODES)
def test_threads_serialize_read_modify_write(tmp_path: Path, mode: LockMode) -> None:
    """8 threads x 25 read-increment-write cycles on one file under the lock lose no update."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    lock_file = tmp_path / "counter.lock"
    errors: list[BaseException] = []

    def bump() -> None:
        try:
            for _ in range(25):
                with path_lock(lock_file, mode=mode, timeout=30):
                    value = int(counter.read_text())
                    counter.write_text(str(value + 1))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert counter.read_text() == "200"


def test_observer_sees_every_wait(tmp_path: Path, observed: list[float]) -> None:
    """The observer gets one wait per attempt: near zero uncontended, >= the timeout on timeout."""
    lock_file = tmp_path / "x.lock"
    with path_lock(lock_file, timeout=1):
        pass
    assert len(observed) == 1
    assert 0 <= observed[0] < 1
    entered = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with path_lock(lock_file, timeout=5):
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert entered.wait(10)
        with pytest.raises(LockTimeout), path_lock(lock_file, timeout=0.1):
            pass
    finally:
        release.set()
        thread.join()
    assert len(observed) == 3
    assert observed[2] >= 0.1


def test_broken_observer_never_breaks_a_lock(tmp_path: Path) -> None:
    """An observer that raises is logged and ignored; the lock still works."""

    def broken(_: float) -> None:
        raise RuntimeError("metrics down")

    set_lock_wait_observer(broken)
    try:
        with path_lock(tmp_path / "x.lock", timeout=1):
            entered = True
    finally:
        set_lock_wait_observer(None)
    assert entered


_CLAIM_ONLY = """
import sys
from workers.persona.shared_claims import acquire_claim, release_claim
assert acquire_claim(sys.argv[1], None, may_break=False)
print("held", flush=True)
sys.stdin.readline()
release_claim(sys.argv[1])
"""


def test_shared_mode_claims_exclude_without_the_waiting_room(tmp_path: Path) -> None:
    """The flock waiting room only queues this host's writers: a claim alone (as a writer on
    another host holds it, its flock unseen here) still excludes."""
    lock_file = tmp_path / "MEMORY.md.shared.lock"
    with (
        held_by_child(_CLAIM_ONLY, str(lock_file)),
        pytest.raises(LockTimeout),
        path_lock(lock_file, mode="shared", timeout=0.3),
    ):
        pass
    with path_lock(lock_file, mode="shared", timeout=5):
        pass


def test_shared_mode_without_a_usable_waiting_room_still_excludes(tmp_path: Path) -> None:
    """A waiting room that cannot be flocked (here a symlink, refused) is skipped: the claims
    alone decide, so writes go on and another holder still excludes."""
    lock_file = tmp_path / "MEMORY.md.shared.lock"
    (tmp_path / "elsewhere").write_text("")
    Path(f"{lock_file}.wait").symlink_to(tmp_path / "elsewhere")
    with path_lock(lock_file, mode="shared", timeout=5):
        pass
    holder, _ = _hold(lock_file, "shared", "wait")
    try:
        with pytest.raises(LockTimeout), path_lock(lock_file, mode="shared", timeout=0.3):
            pass
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(30)

"""Memory writes from real OS processes: nothing lost, nothing torn, nothing left behind."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from pathlib import Path

import pytest

from tests.support.persona import expected_entries, make_persona, memory_worker, tree
from workers.persona.locks import LockMode
from workers.persona.shared_claims import queue_for

# Process-level hammering: several seconds each, so outside the inner loop.
pytestmark = pytest.mark.integration

WORKERS = 4
ADDS = 250

_LAYOUT = {
    "self": ("MEMORY.md", set()),
    "note:shared": ("memory/shared.md", {"memory", ".locks/memory"}),
}


def _run(home: Path, target: str, lock_mode: LockMode) -> None:
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [
        context.Process(
            target=memory_worker,
            args=(str(home),),
            kwargs={
                "target": target,
                "worker": index,
                "count": ADDS,
                "lock_mode": lock_mode,
                "start": start,
            },
        )
        for index in range(WORKERS)
    ]
    for process in processes:
        process.start()
    start.set()  # all four start their churn together, so they contend
    for process in processes:
        process.join(240)
    assert [process.exitcode for process in processes] == [0] * WORKERS


@pytest.mark.parametrize("target", ["self", "note:shared"])
def test_four_processes_lose_nothing(tmp_path: Path, target: str) -> None:
    """4 processes x 250 adds with replaces/removes of their own: every surviving entry is there."""
    home = make_persona(tmp_path / "ava")
    _run(home, target, "local")

    relative, extra_dirs = _LAYOUT[target]
    lines = (home / relative).read_text().split("\n")
    assert lines[-1] == ""  # the file ends with a newline and holds nothing else
    lines = lines[:-1]
    expected = {worker: expected_entries(worker, ADDS) for worker in range(WORKERS)}
    assert Counter(lines) == Counter(line for entries in expected.values() for line in entries)
    for worker, entries in expected.items():
        # Each process's surviving entries appear in the order it wrote them.
        assert [line for line in lines if line.startswith(f"- [p{worker}:")] == entries
    # Writers that found the lock taken queued their writes (the queue is left empty) and
    # some were applied by the holder and answered through the ledger (issue 15).
    beside = {f".locks/{relative}{suffix}" for suffix in (".lock", ".queue", ".applied")}
    assert tree(home) == {relative, ".locks", *beside, *extra_dirs}
    assert (home / ".locks" / f"{relative}.queue").stat().st_size == 0
    handed_off = (home / ".locks" / f"{relative}.applied").read_text().count('{"key": "q')
    assert handed_off > 0


def test_four_processes_shared_lock_mode(tmp_path: Path) -> None:
    """The shared (NFS-safe) lock mode gives the same guarantee with 4 contending processes,
    and this host's writers share commits through this host's queue as in local mode."""
    home = make_persona(tmp_path / "ava")
    _run(home, "self", "shared")
    lines = (home / "MEMORY.md").read_text().splitlines()
    expected = [line for worker in range(WORKERS) for line in expected_entries(worker, ADDS)]
    assert Counter(lines) == Counter(expected)
    # No claim is left, nor any writer's owner record (each removes its own at exit).
    queue = f".locks/{Path(queue_for(str(home / '.locks' / 'MEMORY.md.claim'))).name}"
    beside = {".locks/MEMORY.md.claim.wait", ".locks/MEMORY.md.applied", queue}
    assert tree(home) == {"MEMORY.md", ".locks", *beside}
    assert (home / queue).stat().st_size == 0
    handed_off = (home / ".locks" / "MEMORY.md.applied").read_text().count('{"key": "q')
    assert handed_off > 0

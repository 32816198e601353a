"""owner_records.py: the records behind claims, kept per process, cleaned when owners die."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.claims import die, live_record, records_of
from workers.persona.owner_records import MAX_RECORDS
from workers.persona.shared_claims import acquire_claim, release_claim


def test_records_of_dead_processes_are_removed_by_the_next_taker(tmp_path: Path) -> None:
    """A process killed after releasing leaves its owner record; the next process of this host
    to take that lock removes it (and leaves the records of live processes alone)."""
    claim = tmp_path / "MEMORY.md.claim"
    die(claim, "after-release")
    live = live_record(str(claim))
    assert len(records_of(claim)) == 2
    assert acquire_claim(str(claim), time.monotonic() + 5, may_break=False)
    release_claim(str(claim))
    records = records_of(claim)
    assert len(records) == 2
    assert Path(live) in records
    assert not claim.exists()


def test_a_removed_record_is_written_again(tmp_path: Path) -> None:
    """Someone cleaning .locks removed our owner record: the next acquisition writes a new one."""
    claim = tmp_path / "MEMORY.md.claim"
    assert acquire_claim(str(claim), time.monotonic() + 5, may_break=False)
    release_claim(str(claim))
    (old,) = records_of(claim)
    old.unlink()
    assert acquire_claim(str(claim), time.monotonic() + 5, may_break=False)
    release_claim(str(claim))
    (new,) = records_of(claim)
    assert new != old


def test_a_process_keeps_at_most_max_records(tmp_path: Path) -> None:
    """Taking many different locks leaves at most MAX_RECORDS owner records of this process:
    the least recently used idle one is removed first."""
    for index in range(MAX_RECORDS + 6):
        claim = str(tmp_path / f"note-{index}.md.claim")
        assert acquire_claim(claim, time.monotonic() + 5, may_break=False)
        release_claim(claim)
    records = list(tmp_path.glob("*.owner"))
    assert len(records) <= MAX_RECORDS
    assert any(path.name.startswith(f"note-{MAX_RECORDS + 5}.md.claim.") for path in records)
    assert not any(path.name.startswith("note-0.md.claim.") for path in records)


_FORKING_OWNER = """
import os, signal, sys, time
import socket
import workers.persona.owners  # judged by its lock, not its pid
workers.persona.owners.host_name = lambda: socket.gethostname() + "?pidns-f00d"
from workers.persona.shared_claims import acquire_claim
assert acquire_claim(sys.argv[1], None, may_break=False)
child = os.fork()
if child == 0:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # let the test's read of our parent's output end
    os.dup2(devnull, 2)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_forked_child_does_not_keep_its_parents_records_locked(tmp_path: Path) -> None:
    """A child forked by a claim's owner closes the record descriptors it inherited: once the
    owner dies, its claim reads as dead though the child lives on."""
    claim = tmp_path / "MEMORY.md.claim"
    done = subprocess.run(
        [sys.executable, "-c", _FORKING_OWNER, str(claim)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    child = int(done.stdout)
    try:
        os.kill(child, 0)  # still running
        assert acquire_claim(str(claim), time.monotonic() + 5, may_break=True)
        release_claim(str(claim))
    finally:
        os.kill(child, signal.SIGKILL)

"""owner_records.py: the records behind claims, kept per process, cleaned when owners die."""

from __future__ import annotations

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

"""A persona filesystem that fills up or turns read-only, under a real worker and beat: the
lane waits without paying for model calls and carries on by itself once the disk is fixed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from tests.support.providers import FakeProvider
from tests.support.tmpfs import fill, remount, tmpfs
from workers.persona import storage

pytestmark = pytest.mark.integration


#: Retries fast enough to see several within a test, dead-lettering after 2 unknown failures.
QUICK_RETRIES = {
    "SOULFLEET_RETRY_BASE": "200ms",
    "SOULFLEET_RETRY_MAX": "500ms",
    "SOULFLEET_MAX_ATTEMPTS": "2",
}


def failures(harness: Harness, times: int, says: str = "") -> dict[str, object] | None:
    """ava's lane once it has failed ``times`` times in a row with an error saying ``says``."""
    lane = harness.fleet.lanes.status("ava")
    error = str(lane.get("last_error") or "")
    failed = int(str(lane["failures"] or 0))
    return lane if says in error and failed >= times else None


def test_a_full_then_read_only_persona_disk_costs_no_model_call_and_the_lane_resumes(
    harness: Harness, tmp_path: Path
) -> None:
    """ava's home is a small tmpfs. Filled up, her posted turn is refused before its model
    call, again and again past SOULFLEET_MAX_ATTEMPTS without being dead-lettered (transient),
    with an error naming her directory and the free bytes; emptied but read-only, the same
    with "read-only"; writable again, the turn runs once and the item is answered."""
    with FakeProvider("openai", text="saved at last") as provider:
        harness.use_model_server(provider, **QUICK_RETRIES)
        with tmpfs(harness.root / "ava", "4m") as home:
            harness.persona("ava")
            filler = fill(home, leave=storage.MIN_FREE_BYTES // 2)
            harness.worker()
            harness.beat()
            harness.fleet.post("ava", "hello")

            full = wait_until(
                lambda: failures(harness, 4, "bytes free"), timeout=60, what="4 refusals"
            )
            assert str(full["last_error"]).startswith(f"{storage.STORAGE_MARK} at {home}")
            assert full["last_error_kind"] == "transient"
            assert full["state"] != "dead"
            assert provider.requests == []

            filler.unlink()
            remount(home, "ro")
            done_before = int(str(full["failures"] or 0))
            read_only = wait_until(
                lambda: failures(harness, done_before + 2, "read-only"),
                timeout=60,
                what="read-only",
            )
            assert read_only["state"] != "dead"
            assert provider.requests == []

            remount(home, "rw")
            wait_until(
                lambda: harness.fleet.lanes.status("ava").get("last_status") == "done",
                timeout=60,
                what="the turn to run once the disk is writable",
            )
            assert len(provider.requests) == 1
            assert harness.fleet.lanes.status("ava")["last_text"] == "saved at last"
            harness.stop()


def test_a_persona_directory_refusing_the_worker_waits_and_resumes_once_fixed(
    harness: Harness, tmp_path: Path
) -> None:
    """ava's home made immutable (`chattr +i`: EPERM even for root, as a wrong owner is EACCES
    for a worker's user): her turn is refused without a model call, past
    SOULFLEET_MAX_ATTEMPTS, never dead-lettered (it was, within 20 s: an unknown failure),
    with an error saying to fix the directory's access; once fixed the turn runs once."""
    with FakeProvider("openai", text="written at last") as provider:
        harness.use_model_server(provider, **QUICK_RETRIES)
        home = harness.persona("ava")
        subprocess.run(["chattr", "+i", str(home)], check=True)
        try:
            harness.worker()
            harness.beat()
            harness.fleet.post("ava", "hello")

            lane = wait_until(lambda: failures(harness, 4), timeout=60, what="4 refusals")
            error = str(lane["last_error"])
            assert error.startswith(f"{storage.STORAGE_MARK} at {home}"), error
            assert "Operation not permitted" in error
            assert "write access to the persona directory" in error
            assert lane["last_error_kind"] == "transient"
            assert lane["state"] != "dead"
            assert provider.requests == []
        finally:
            subprocess.run(["chattr", "-i", str(home)], check=True)
        wait_until(
            lambda: harness.fleet.lanes.status("ava").get("last_status") == "done",
            timeout=60,
            what="the turn to run once the directory is writable",
        )
        assert len(provider.requests) == 1
        harness.stop()

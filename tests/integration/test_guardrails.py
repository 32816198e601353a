"""Production faults against real worker and beat processes (issue 10): side effects once,
no file that blocks the clock."""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import FleetProcess, post_past_the_door, wait_until
from tests.support.memory import remember_then_answer
from workers.cli.status import invalid_personas
from workers.persona.errors import PersonaError

pytestmark = pytest.mark.integration


def test_a_memory_write_from_a_turn_killed_three_times_lands_once(harness: Harness) -> None:
    """A turn adds a memory entry and its worker is SIGKILLed before it commits, three times
    (the reaper re-queues it each time, a new worker retries it); the fourth attempt commits.
    MEMORY.md holds the entry ONCE, and each retry's repeated add was answered from the ledger."""
    harness.configure(SOULFLEET_LEASE_TTL="2", SOULFLEET_REAP_INTERVAL="1")
    home = harness.persona("ava", rules=remember_then_answer(120))
    harness.beat()
    for attempt in range(3):
        worker = harness.worker(f"w{attempt}")
        if attempt == 0:
            harness.fleet.post("ava", "Please remember: the sky is green.", sender="tester")

        def wrote(w: FleetProcess = worker) -> bool:
            return bool(w.events("memory.write") or w.events("memory.write_replayed"))

        wait_until(wrote, timeout=120, what=f"attempt {attempt + 1}'s memory write")
        worker.kill()
    (home / "rules.toml").write_text(remember_then_answer(0))
    final = harness.worker("w3")
    wait_until(
        lambda: [e for e in final.events("turn.end") if e.get("status") == "done"],
        timeout=120,
        what="the fourth attempt's commit",
    )
    memory = (home / "MEMORY.md").read_text()
    assert memory.count("The sky is green.") == 1, memory
    assert len(harness.events("memory.write")) == 1
    assert len(harness.events("memory.write_replayed")) == 3
    assert harness.fleet.lanes.status("ava")["last_status"] == "done"


def test_fifo_and_device_personas_never_stall_beat_or_a_worker(harness: Harness) -> None:
    """Beside healthy personas on 1 s heartbeats: a FIFO persona.toml, a FIFO HEARTBEAT.md, a
    HEARTBEAT.md symlinked to /dev/zero and a 400-digit duration. beat keeps sweeping and every
    healthy persona keeps getting turns; the bad ones are recorded invalid; a worker given
    turns for them ends each one (none stays running)."""
    harness.configure(SOULFLEET_SYNC_INTERVAL="1")
    for n in range(5):
        harness.persona(
            f"ok{n}",
            toml='[heartbeat]\nevery = "1s"\n',
            files={"HEARTBEAT.md": "Nothing is due: reply HEARTBEAT_OK.\n"},
        )
    fifo_toml = harness.persona("fifo-toml")
    os.mkfifo(fifo_toml / "persona.toml")
    fifo_heartbeat = harness.persona("fifo-heartbeat", toml='[heartbeat]\nevery = "1s"\n')
    os.mkfifo(fifo_heartbeat / "HEARTBEAT.md")
    zero = harness.persona("zero", toml='[heartbeat]\nevery = "1s"\n')
    (zero / "HEARTBEAT.md").symlink_to("/dev/zero")
    harness.persona("huge", toml='[heartbeat]\nevery = "1' + "0" * 400 + 'd"\n')
    bad = ("fifo-toml", "fifo-heartbeat", "zero", "huge")
    worker = harness.worker()
    beat = harness.beat()
    for name in bad:
        with pytest.raises(PersonaError):  # refused at the door, the reason named
            harness.fleet.post(name, "hello", sender="tester")
        post_past_the_door(harness.fleet, name, "hello")  # a file may turn bad after a post
    wanted = {f"ok{n}" for n in range(5)} | set(bad)

    def settled() -> bool:
        ended = {e["lane"] for e in worker.events("turn.end")}
        return wanted <= ended and len(beat.events("sweep.done")) >= 4

    # Generous: a loaded machine is slow, never wrong. Each bad persona's turn must END (as
    # an error) and every healthy one must get turns while beat keeps sweeping.
    wait_until(settled, timeout=120, what="turns for every persona and four sweeps")
    assert not beat.events("beat.task_failed")

    def none_running() -> bool:  # a retry may be mid-start at one instant; never for long
        return all(harness.fleet.lanes.status(name)["state"] != "running" for name in bad)

    wait_until(none_running, timeout=60, what="no bad persona's lane left running")
    invalid = _invalid(harness)
    assert set(invalid) == set(bad)
    assert "FIFO" in invalid["fifo-toml"]
    assert "character device" in invalid["zero"]
    assert "longer than the longest duration" in invalid["huge"]


def _invalid(harness: Harness) -> dict[str, str]:
    return invalid_personas(harness.fleet)

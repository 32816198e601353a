"""shared_claims.py: hard-link claims, dead claims, lost replies, the operator's break."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import structlog.testing

import workers.celery
from tests.support.claims import die, live_record, records_of
from tests.support.memory import held_by_child, ok
from tests.support.persona import make_persona
from workers.persona.errors import PersonaFileError
from workers.persona.locks import lock_file_for
from workers.persona.memory import memory_tool
from workers.persona.owner_records import Claim, encode_record, read_claim
from workers.persona.owners import Owner, boot_id, host_name
from workers.persona.shared_claims import (
    acquire_claim,
    break_shared_lock,
    check_hard_links,
    queue_for,
    release_claim,
    shared_lock_holders,
)


def test_a_claim_is_a_hard_link_to_its_owner_record(tmp_path: Path) -> None:
    """While held, the claim is the owner record (same inode) naming this process and host;
    after release the claim is gone and the record stays for the next acquisition."""
    claim = tmp_path / "MEMORY.md.claim"
    assert acquire_claim(str(claim), time.monotonic() + 5, may_break=False)
    try:
        (record,) = records_of(claim)
        assert claim.stat().st_ino == record.stat().st_ino
        found = read_claim(str(claim))
        assert found is not None
        assert isinstance(found[1], Claim)
        assert found[1].owner == Owner.current()
        mine = f"held claim by pid {os.getpid()} on {host_name()}"
        assert shared_lock_holders(claim) == (mine,)
    finally:
        release_claim(str(claim))
    assert not claim.exists()
    assert records_of(claim) == [record]
    assert shared_lock_holders(claim) == ()


def test_a_held_claim_excludes_until_released(tmp_path: Path) -> None:
    """A claim of another live process (even one of this host, even for a taker allowed to
    break dead claims) makes a taker time out; once it is released the taker gets it."""
    claim = str(tmp_path / "MEMORY.md.claim")
    os.link(live_record(claim), claim)
    began = time.monotonic()
    assert not acquire_claim(claim, time.monotonic() + 0.3, may_break=True)
    assert time.monotonic() - began >= 0.3
    os.unlink(claim)
    assert acquire_claim(claim, time.monotonic() + 1, may_break=False)
    release_claim(claim)


def test_a_dead_claim_is_broken_only_by_a_writer_in_the_waiting_room(tmp_path: Path) -> None:
    """A claim left by a dead process of this host blocks a taker that does not hold the
    waiting room (two breakers must never race); one that does breaks it, logs it, and
    removes the dead owner's record too."""
    claim = tmp_path / "MEMORY.md.claim"
    pid = die(claim, "holding")
    assert f"pid {pid} " in shared_lock_holders(claim)[0]
    assert not acquire_claim(str(claim), time.monotonic() + 0.3, may_break=False)
    with structlog.testing.capture_logs() as logs:
        assert acquire_claim(str(claim), time.monotonic() + 5, may_break=True)
    try:
        broken = [log for log in logs if log["event"] == "lock.dead_claim_broken"]
        assert len(broken) == 1
        assert f"pid {pid} " in broken[0]["claim"]
        holders = shared_lock_holders(claim)
        assert len(holders) == 1
        assert f"pid {os.getpid()} " in holders[0]
    finally:
        release_claim(str(claim))
    assert len(records_of(claim)) == 1  # ours; the dead holder's went with its claim


def test_a_reply_lost_after_the_link_still_counts_as_held(tmp_path: Path) -> None:
    """If the claim already is our own record (an NFS link whose reply was lost, then
    retried), the taker holds the lock instead of waiting for itself."""
    claim = str(tmp_path / "MEMORY.md.claim")
    assert acquire_claim(claim, time.monotonic() + 5, may_break=False)
    release_claim(claim)
    (record,) = records_of(Path(claim))
    os.link(record, claim)
    assert acquire_claim(claim, time.monotonic(), may_break=False)
    release_claim(claim)
    assert not Path(claim).exists()


def test_an_unreadable_claim_blocks_is_named_and_can_be_broken(tmp_path: Path) -> None:
    """A file at the claim path that is no owner record (a stray file, an older release's
    lock) blocks like any claim, is named as unreadable, and break_shared_lock clears it."""
    claim = tmp_path / "MEMORY.md.claim"
    claim.write_text("junk")
    assert not acquire_claim(str(claim), time.monotonic() + 0.2, may_break=True)
    assert shared_lock_holders(claim) == ("unreadable claim (not a soulfleet owner record)",)
    assert break_shared_lock(claim) == ("unreadable claim (not a soulfleet owner record)",)
    assert break_shared_lock(claim) == ()
    assert acquire_claim(str(claim), time.monotonic() + 1, may_break=False)
    release_claim(str(claim))


def test_a_filesystem_without_hard_links_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where link(2) is refused (a filesystem without hard links), a shared-mode write fails
    with an error that says so; nothing is written."""
    home = make_persona(tmp_path / "ava")
    lock_file_for(home, home / "MEMORY.md", "shared")

    def refuse(src: str, dst: str, **_: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted", src, None, dst)

    monkeypatch.setattr(os, "link", refuse)
    result = memory_tool(home, lock_mode="shared").execute({"action": "add", "text": "x"})
    assert result.is_error
    assert "does not support hard links, which shared lock mode needs" in result.output
    assert "Nothing was changed" in result.output
    assert not (home / "MEMORY.md").exists()


def test_a_claim_broken_while_held_is_not_removed_again_on_release(tmp_path: Path) -> None:
    """If an operator broke our claim while we held it and another writer took the lock,
    our release leaves that writer's claim alone and logs that ours was lost."""
    claim = str(tmp_path / "MEMORY.md.claim")
    assert acquire_claim(claim, time.monotonic() + 5, may_break=False)
    assert break_shared_lock(claim)
    os.link(live_record(claim), claim)
    with structlog.testing.capture_logs() as logs:
        release_claim(claim)
    assert [log["event"] for log in logs] == ["lock.claim_lost"]
    assert f"pid {os.getppid()} " in logs[0]["found"]
    assert Path(claim).exists()


def test_each_machine_queues_in_its_own_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers that hand their write over queue in a file of their kernel only (appends are
    whole only within one kernel), beside the claim: another machine (another boot id) gets
    another file, another container on this machine (another host name) the same one."""
    claim = "/personas/ava/.locks/MEMORY.md.claim"
    mine = queue_for(claim)
    monkeypatch.setattr("socket.gethostname", lambda: "othercontainer")
    assert queue_for(claim) == mine
    monkeypatch.setattr("workers.persona.shared_claims.boot_id", lambda: 0x1234)
    theirs = queue_for(claim)
    assert mine != theirs
    for queue in (mine, theirs):
        assert queue.startswith("/personas/ava/.locks/MEMORY.md.")
        assert queue.endswith(".queue")


#: How a process of this machine in another pid namespace names its host.
_OTHER = f"{socket.gethostname()}?pidns-f00d"

_OTHER_NAMESPACE = """
import os, signal, socket, sys
import workers.persona.owners  # this machine and kernel, another pid namespace
workers.persona.owners.host_name = lambda: socket.gethostname() + "?pidns-f00d"
from workers.persona.shared_claims import acquire_claim
assert acquire_claim(sys.argv[1], None, may_break=False)
print("held", os.getpid(), flush=True)
if sys.argv[2] == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.readline()
"""


def test_a_claim_from_another_pid_namespace_of_this_kernel_is_judged_by_its_lock(
    tmp_path: Path,
) -> None:
    """A container restarted after a crash keeps its host name but gets a new pid namespace:
    its old claim names a pid that means nothing here. On the same kernel the owner's lock on
    its record tells: held while the owner lives (the claim stays), gone once it died (the
    claim is broken)."""
    claim = tmp_path / "MEMORY.md.claim"
    with held_by_child(_OTHER_NAMESPACE, str(claim), "wait"):
        holders = shared_lock_holders(claim)
        assert len(holders) == 1
        assert holders[0].endswith(f"on {_OTHER}")
        assert not acquire_claim(str(claim), time.monotonic() + 0.3, may_break=True)
    assert acquire_claim(str(claim), time.monotonic() + 5, may_break=True)  # released
    release_claim(str(claim))
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_NAMESPACE, str(claim), "crash"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL
    assert shared_lock_holders(claim)[0].endswith(f"on {_OTHER}")
    assert not acquire_claim(str(claim), time.monotonic() + 0.3, may_break=False)
    with structlog.testing.capture_logs() as logs:
        assert acquire_claim(str(claim), time.monotonic() + 5, may_break=True)
    release_claim(str(claim))
    assert [log["claim"] for log in logs if log["event"] == "lock.dead_claim_broken"] == [
        f"held claim by pid {done.stdout.split()[1]} on {_OTHER}"
    ]


def test_breaking_a_claim_removes_its_owners_record_and_whatever_blocks_the_path(
    tmp_path: Path,
) -> None:
    """break_shared_lock removes the claim and the record it was linked to (another machine's
    dead writer would never remove it); an empty directory at the claim path goes too."""
    claim = tmp_path / "MEMORY.md.claim"
    record = live_record(str(claim))
    os.link(record, claim)
    assert len(break_shared_lock(claim)) == 1
    assert not claim.exists()
    assert not Path(record).exists()
    claim.mkdir()
    assert break_shared_lock(claim) == ("unreadable claim (Is a directory)",)
    assert not claim.exists()


def test_a_directory_with_files_at_the_claim_path_is_named_and_left_alone(
    tmp_path: Path,
) -> None:
    """break_shared_lock does not delete what someone put in a directory at the claim path: it
    raises PersonaFileError naming the path and what to do, and the files stay."""
    claim = tmp_path / "MEMORY.md.claim"
    claim.mkdir()
    (claim / "notes.txt").write_text("keep me")
    with pytest.raises(PersonaFileError, match=r"directory with files in it.*move it away"):
        break_shared_lock(claim)
    assert (claim / "notes.txt").read_text() == "keep me"


def test_a_directory_whose_filesystem_has_hard_links_passes_the_start_check(
    tmp_path: Path,
) -> None:
    """check_hard_links finds nothing wrong on a filesystem with hard links (this one), and
    leaves nothing behind; a directory it cannot write to is not judged."""
    assert check_hard_links(tmp_path) is None
    assert list(tmp_path.iterdir()) == []
    assert check_hard_links(tmp_path / "missing") is None


def test_a_filesystem_without_hard_links_is_refused_at_worker_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where link(2) is refused, a shared-mode worker refuses to start (exit 78, EX_CONFIG)
    naming the personas directory and the setting, instead of failing every memory write."""

    def refuse(src: str, dst: str, **_: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted", src, None, dst)

    monkeypatch.setattr(os, "link", refuse)
    assert "without hard links (Operation not permitted)" in (check_hard_links(tmp_path) or "")
    assert list(tmp_path.iterdir()) == []
    shared = dataclasses.replace(workers.celery.settings, lock_mode="shared", personas=tmp_path)
    monkeypatch.setattr(workers.celery, "settings", shared)
    monkeypatch.setattr(workers.celery, "refuse_to_start_on_eviction", lambda *_: None)
    # A worker configures logging for its process (cached loggers, INFO and up): done in the
    # test process, it left later tests' capture_logs blind to info events.
    monkeypatch.setattr(workers.celery, "configure_logging", lambda *_, **__: None)
    with pytest.raises(SystemExit) as exited:
        workers.celery._worker_init()
    assert exited.value.code == 78
    err = capsys.readouterr().err
    assert "soulfleet worker: refusing to start:" in err
    assert "SOULFLEET_LOCK_MODE=shared needs for its claims" in err


def test_shared_mode_works_where_flock_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a filesystem without flock (NFSv3 without lockd: ENOLCK) the claim alone excludes:
    writes go on, and the owner record says its lock cannot be relied on."""

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    home_dir = make_persona(tmp_path / "ava")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    ok(memory_tool(home_dir, lock_mode="shared"), action="add", text="over nfs v3")
    assert "- over nfs v3" in (home_dir / "MEMORY.md").read_text()
    (record,) = (home_dir / ".locks").glob("MEMORY.md.claim.*.owner")
    assert record.read_text().splitlines()[-1] == "0"


def test_shared_mode_works_with_nfs4_lock_semantics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFSv4 turns flock into POSIX locks, which refuse a shared lock on a file opened
    write-only and an exclusive one on a file opened read-only (EBADF): owner records are
    opened read-write, so writes go on and the record's lock holds."""
    real = fcntl.flock

    def nfs4(fd: int, operation: int) -> None:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        if (operation & fcntl.LOCK_SH and mode == os.O_WRONLY) or (
            operation & fcntl.LOCK_EX and mode == os.O_RDONLY
        ):
            raise OSError(errno.EBADF, "Bad file descriptor")
        real(fd, operation)

    home_dir = make_persona(tmp_path / "ava")
    monkeypatch.setattr(fcntl, "flock", nfs4)
    ok(memory_tool(home_dir, lock_mode="shared"), action="add", text="over nfs v4")
    (record,) = (home_dir / ".locks").glob("MEMORY.md.claim.*.owner")
    assert record.read_text().splitlines()[-1] == "1"


def _record(claim: Path, host: str, boot: int, *, locked: bool) -> str:
    """An owner record of a process that ran on ``host`` in the boot ``boot`` (pid 4242)."""
    owner = Owner(4242, host, (boot << 64) | 12345)
    path = f"{claim}.cafe0000cafe0000.owner"
    Path(path).write_bytes(encode_record(owner, "cafe0000cafe0000", locked=locked))
    return path


def test_a_claim_from_an_earlier_boot_of_this_machine_is_broken(tmp_path: Path) -> None:
    """A container's claim left before this machine rebooted (another pid namespace, another
    boot id, this host name) is broken: every process of an earlier boot is gone. Another
    machine's (another host name) is not, whatever its boot id."""
    claim = tmp_path / "MEMORY.md.claim"
    earlier = (boot_id() or 0) ^ 1
    os.link(_record(claim, f"{socket.gethostname()}?pidns-beef", earlier, locked=True), claim)
    assert acquire_claim(str(claim), time.monotonic() + 5, may_break=True)
    release_claim(str(claim))
    for leftover in tmp_path.glob("*.owner"):
        leftover.unlink()
    os.link(_record(claim, "othermachine?pidns-beef", earlier, locked=True), claim)
    assert not acquire_claim(str(claim), time.monotonic() + 0.3, may_break=True)

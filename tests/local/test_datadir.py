"""The data directory of `soulfleet up`: its location, its lock and its state file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.local.datadir import AlreadyRunningError, DataDir, UpState, default_data_dir, pid_alive


def test_default_data_dir_follows_xdg() -> None:
    """$XDG_DATA_HOME/soulfleet when absolute, else ~/.local/share/soulfleet."""
    assert default_data_dir({"XDG_DATA_HOME": "/x/data", "HOME": "/h"}) == Path("/x/data/soulfleet")
    assert default_data_dir({"XDG_DATA_HOME": "rel", "HOME": "/h"}) == Path(
        "/h/.local/share/soulfleet"
    )
    assert default_data_dir({"HOME": "/h"}) == Path("/h/.local/share/soulfleet")


def test_soulfleet_data_names_the_data_dir_before_xdg(tmp_path: Path) -> None:
    """$SOULFLEET_DATA (what `up --data DIR` ran on) wins; a relative one is made absolute."""
    env = {"SOULFLEET_DATA": "/srv/fleet", "XDG_DATA_HOME": "/x/data", "HOME": "/h"}
    assert default_data_dir(env) == Path("/srv/fleet")
    assert default_data_dir({**env, "SOULFLEET_DATA": "rel"}) == Path.cwd() / "rel"
    assert default_data_dir({**env, "SOULFLEET_DATA": "  "}) == Path("/x/data/soulfleet")


def _state(data: DataDir, pid: int) -> UpState:
    return UpState(pid=pid, redis_url="redis://127.0.0.1:1/0", personas="/p", key_prefix="k:",
                   queue_prefix="k", data=str(data.root), started_at=2.5,
                   mcp_config="/etc/mcp.json", python_path=("/opt/tools", "/srv/x"))  # fmt: skip


def test_state_round_trips_and_is_cleared_only_by_its_owner(tmp_path: Path) -> None:
    """up.json reads back equal; clear_state leaves another pid's file alone."""
    data = DataDir(tmp_path / "d")
    state = _state(data, os.getpid())
    data.write_state(state)
    assert data.read_state() == state
    assert data.running_state() == state
    data.clear_state(os.getpid() + 1)
    assert data.state_path.exists()
    data.clear_state(os.getpid())
    assert data.read_state() is None


def test_stale_or_corrupt_state_is_not_running(tmp_path: Path) -> None:
    """A dead pid's state file is stale; a corrupt one reads as absent."""
    data = DataDir(tmp_path / "d")
    data.write_state(_state(data, 2**22 + 999))
    assert not pid_alive(2**22 + 999)
    assert data.read_state() is not None
    assert data.running_state() is None
    data.state_path.write_text("{not json", encoding="utf-8")
    assert data.read_state() is None


def test_the_lock_excludes_a_second_process(tmp_path: Path) -> None:
    """While one process holds up.lock, another's lock() raises AlreadyRunningError naming it."""
    data = DataDir(tmp_path / "d")
    lock = data.lock()
    data.write_state(_state(data, os.getpid()))
    try:
        probe = (
            "import sys; from pathlib import Path; from workers.local.datadir import DataDir, "
            "AlreadyRunningError\n"
            "try:\n DataDir(Path(sys.argv[1])).lock()\nexcept AlreadyRunningError as e:\n"
            " print(e); sys.exit(7)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", probe, str(data.root)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 7, result.stderr
        assert "already running" in result.stdout
        assert f"pid {os.getpid()}" in result.stdout
    finally:
        lock.release()
    again = data.lock()
    again.release()


def test_lock_in_process_is_exclusive_too(tmp_path: Path) -> None:
    """A second lock() in the same process also fails while the first is held."""
    data = DataDir(tmp_path / "d")
    lock = data.lock()
    try:
        with pytest.raises(AlreadyRunningError):
            DataDir(tmp_path / "d").lock()
    finally:
        lock.release()


def test_a_lock_holder_up_json_does_not_list_is_named_not_unknown(tmp_path: Path) -> None:
    """`up` is gone and a process it did not record holds the inherited lock (Redis's
    AOF-rewrite fork, or one started before up.json was rewritten): the refusal said "pids
    unknown ... (`kill unknown`)". It names the process that holds the folder."""
    data = DataDir(tmp_path / "d")
    lock = data.lock()
    holder = subprocess.Popen(["sleep", "60"], pass_fds=(lock.fd,))
    try:
        lock.release()  # `up` is gone; only the holder keeps the folder locked
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        data.write_state(_state(data, int(gone.stdout)))
        with pytest.raises(AlreadyRunningError) as refused:
            data.lock()
        message = str(refused.value)
        assert "unknown" not in message, message
        assert str(holder.pid) in message, message
    finally:
        holder.kill()
        holder.wait(timeout=30)
    data.lock().release()

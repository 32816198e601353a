"""`soulfleet up` owns its children: no way `up` ends leaves a fleet running behind it.

Each test starts a real `up` (embedded Redis, beat, a worker) as a user would, ends it the way a
terminal, a pipe or the kernel would, and then checks by pid (with start time, so a reused pid
does not count) that none of the processes it started is still alive.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import termios
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import (
    Proc,
    descendants,
    reaping,
    run_soulfleet,
    soulfleet_argv,
    subprocess_env,
)
from tests.support.fleet import wait_until
from workers.local.datadir import AlreadyRunningError, DataDir

pytestmark = pytest.mark.integration

DEADLINE = 90.0


def _env(base: Path) -> dict[str, str | None]:
    env: dict[str, str | None] = {
        name: None
        for name in os.environ
        if name.startswith(("SOULFLEET_", "CELERY_", "OPENAI_", "ANTHROPIC_"))
    }
    env.update({"REDIS_URL": None, "XDG_DATA_HOME": str(base / "xdg")})
    return env


def _children_started(data: Path, process: subprocess.Popen[Any]) -> list[Proc]:
    """Wait until up.json lists Redis, beat and the worker; return up's live descendants."""

    def ready() -> bool:
        assert process.poll() is None, f"up exited with {process.returncode}"
        try:
            state = json.loads((data / "up.json").read_text("utf-8"))
        except (OSError, ValueError):
            return False
        return len(state.get("children", ())) >= 3

    wait_until(ready, timeout=DEADLINE, interval=0.2, what="up to start its children")
    found = descendants(process.pid)
    commands = " | ".join(child.cmdline for child in found)
    assert "redis-server" in commands, commands
    assert "celery -A workers worker" in commands, commands
    return found


def _assert_all_gone(children: list[Proc], timeout: float = 60.0) -> None:
    wait_until(lambda: not [c for c in children if c.alive()], timeout=timeout,
               what=f"every child of up to exit: {[c for c in children if c.alive()]}")  # fmt: skip


def _take_controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_closing_the_terminal_of_up_stops_every_child(tmp_path: Path) -> None:
    """`up` on a pseudo-terminal that is then closed (SIGHUP, writes fail with EIO) stops its
    fleet in order and exits; no child survives."""
    data = tmp_path / "xdg" / "soulfleet"
    master, slave = os.openpty()
    process = subprocess.Popen(
        soulfleet_argv("up", "--data", str(data)),
        env=subprocess_env(_env(tmp_path)),
        stdin=slave, stdout=slave, stderr=slave, cwd=str(tmp_path),
        start_new_session=True, preexec_fn=_take_controlling_terminal,  # noqa: PLW1509
    )  # fmt: skip
    os.close(slave)
    seen: list[bytes] = []
    closing = threading.Event()

    def drain() -> None:  # a terminal shows what it is sent; a full pty buffer would block up
        while not closing.is_set():
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready and not closing.is_set():
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                seen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    with reaping(process):
        children = _children_started(data, process)
        wait_until(lambda: b"Ctrl-C stops everything." in b"".join(seen), timeout=DEADLINE,
                   what="up's banner on the terminal")  # fmt: skip
        closing.set()
        reader.join(timeout=5)
        os.close(master)  # the terminal window closes
        assert process.wait(timeout=120) == 0
        _assert_all_gone(children)
        assert not (data / "up.json").exists()


def test_up_piped_into_head_stops_every_child_when_head_exits(tmp_path: Path) -> None:
    """`soulfleet up | head -12`: once head has its lines and exits, up's next write fails with
    EPIPE; up stops the fleet, says why on stderr and exits 0; no child survives."""
    data = tmp_path / "xdg" / "soulfleet"
    errors = tmp_path / "up.err"
    with errors.open("wb") as sink:
        process = subprocess.Popen(
            soulfleet_argv("up", "--data", str(data)),
            env=subprocess_env(_env(tmp_path)),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=sink, cwd=str(tmp_path),
        )  # fmt: skip
    assert process.stdout is not None
    head = subprocess.Popen(["head", "-12"], stdin=process.stdout, stdout=subprocess.PIPE)
    process.stdout.close()  # only head reads up's output now, as in a shell pipeline
    with reaping(process):
        children = _children_started(data, process)
        shown, _ = head.communicate(timeout=DEADLINE)
        assert shown.decode().startswith("soulfleet up: data in"), shown
        assert process.wait(timeout=120) == 0, errors.read_text()
        _assert_all_gone(children)
        text = errors.read_text()
        assert "stdout closed: stopping the fleet" in text, text
        assert "Traceback" not in text, text
        assert "Broken pipe" not in text, text


def test_sigkill_of_up_takes_its_children_with_it(tmp_path: Path) -> None:
    """SIGKILL of `up` (no handler can run): the kernel's parent-death signal ends Redis, beat
    and the worker; the data folder is then free for the next `up`."""
    data = tmp_path / "xdg" / "soulfleet"
    process = subprocess.Popen(
        soulfleet_argv("up", "--data", str(data)),
        env=subprocess_env(_env(tmp_path)),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd=str(tmp_path),
    )  # fmt: skip
    with reaping(process):
        children = _children_started(data, process)
        process.kill()
        process.wait(timeout=30)
        _assert_all_gone(children)
    _assert_folder_freed(data)


def _assert_folder_freed(data: Path, timeout: float = 30.0) -> None:
    """Nobody holds the folder any more: the next `up` can take it. Waited for, bounded: a
    fork a child made just before `up` died inherits the lock but not the parent-death signal
    (most likely Redis creating its first AOF in a background rewrite right after it starts),
    and holds the folder until its work is done. CI once saw the folder still held straight
    after the kill."""

    def free() -> bool:
        try:
            DataDir(data).lock().release()
        except AlreadyRunningError:
            return False
        return True

    wait_until(free, timeout=timeout, interval=0.2, what="the data folder to be free")


_SURVIVOR = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from workers.local.datadir import DataDir, UpState
    from workers.local.supervisor import ChildSpec, Supervisor

    data = DataDir(Path(sys.argv[1]))
    lock = data.lock()
    supervisor = Supervisor(keep_fds=(lock.fd,))
    child = supervisor.start(ChildSpec(
        name="survivor", argv=["sleep", "120"], env=dict(os.environ),
        log_path=data.logs / "survivor.log", parent_death_signal=None,
    ))
    data.write_state(UpState(
        pid=os.getpid(), redis_url="redis://127.0.0.1:1/0", personas="p", key_prefix="k:",
        queue_prefix="q", data=str(data.root), started_at=time.time(), children=(child.pid,),
    ))
    print(child.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_second_up_is_refused_while_a_child_of_the_first_lives(tmp_path: Path) -> None:
    """A child that outlives its `up` (a platform without parent-death signals) still holds the
    inherited lock: a second `up` on that folder exits 1 naming the survivor's pid; once it is
    gone, the folder is free."""
    data = tmp_path / "xdg" / "soulfleet"
    first = subprocess.run(
        [sys.executable, "-c", _SURVIVOR, str(data)], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    survivor = int(first.stdout.split()[-1])
    try:
        second = run_soulfleet("up", "--data", str(data), env=_env(tmp_path), timeout=60)
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"pids {survivor}" in second.stderr, second.stderr
        assert "still run" in second.stderr
    finally:
        os.kill(survivor, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{survivor}").exists() or _zombie(survivor),
               timeout=30, what="the survivor to exit")  # fmt: skip
    DataDir(data).lock().release()


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"

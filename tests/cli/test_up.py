"""`soulfleet up` as a user runs it: a real process, no REDIS_URL, the demo, then Ctrl-C.

One `up` is started for the module (on a temporary data directory that is also the default
one, via XDG_DATA_HOME, so other commands can find it) and the tests run against it in order;
the last one sends SIGINT and checks that every child process is gone and the exit code is 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.support.cli import (
    PASSWORD,
    descendants,
    reaping,
    run_soulfleet,
    soulfleet_argv,
    subprocess_env,
)
from tests.support.fleet import wait_until
from tests.support.tmpfs import fill, tmpfs
from workers.cli.up import RESTARTS
from workers.local.datadir import RootInUseError, lock_personas_root
from workers.local.redis_server import RedisServer

pytestmark = pytest.mark.integration

DEADLINE = 90.0


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    data: Path
    output: Path
    env: dict[str, str | None]

    def text(self) -> str:
        return self.output.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"up exited with {self.process.returncode}:\n{self.text()}")
        return True


def _clean_env(xdg: Path) -> dict[str, str | None]:
    env: dict[str, str | None] = {
        name: None
        for name in os.environ
        if name.startswith(("SOULFLEET_", "CELERY_", "OPENAI_", "ANTHROPIC_"))
    }
    env.update({"REDIS_URL": None, "XDG_DATA_HOME": str(xdg)})
    return env


@contextlib.contextmanager
def start_up(
    base: Path, *args: str, output_name: str = "up.out", redis_url: str | None = None
) -> Iterator[Up]:
    """`soulfleet up --data <XDG_DATA_HOME>/soulfleet [args]` with no REDIS_URL (or
    ``redis_url``), output to a file; whatever is still running at the end is killed (children
    first)."""
    env = {**_clean_env(base / "xdg"), "REDIS_URL": redis_url}
    data = base / "xdg" / "soulfleet"
    output = base / output_name
    with output.open("wb") as sink:
        process = subprocess.Popen(
            soulfleet_argv("up", "--data", str(data), *args),
            env=subprocess_env(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=str(base),
        )
    with reaping(process):
        yield Up(process, data, output, env)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """One `up` shared by the tests below, in order (the last one stops it)."""
    with start_up(tmp_path_factory.mktemp("up")) as running:
        yield running


def test_a_second_up_on_the_same_data_dir_is_refused(up: Up) -> None:
    """While one `up` runs, another on its data dir exits 1 saying one is already running."""
    wait_until(lambda: up.alive() and (up.data / "up.json").exists(), timeout=DEADLINE,
               what="up.json")  # fmt: skip
    second = run_soulfleet("up", "--data", str(up.data), env=up.env, timeout=60)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "already running" in second.stderr
    assert f"pid {up.process.pid}" in second.stderr
    assert up.alive()


def test_a_running_up_holds_its_demo_personas_root_against_another_up(
    up: Up, tmp_path: Path
) -> None:
    """The running `up` (demo personas, in its data folder) holds that root: another `up` from
    another data folder naming it with --personas is refused (two fleets on one root), and the
    running one goes on."""
    wait_until(lambda: up.alive() and (up.data / "up.json").exists(), timeout=DEADLINE,
               what="up.json")  # fmt: skip
    root = up.data / "personas"
    with pytest.raises(RootInUseError):
        lock_personas_root(root)
    second = run_soulfleet("up", "--data", str(tmp_path / "other"), "--personas", str(root),
                           env=up.env, timeout=60)  # fmt: skip
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"another soulfleet up serves the personas root {root.resolve()}" in second.stderr
    assert up.alive()


def test_other_commands_find_the_running_up_without_redis_url(up: Up) -> None:
    """With REDIS_URL unset, `post` and `status` reach the `up` recorded in the default data dir."""
    wait_until(lambda: up.alive() and (up.data / "up.json").exists(), timeout=DEADLINE,
               what="up.json")  # fmt: skip
    posted = run_soulfleet("post", "nora", "remember: the test was here", env=up.env)
    assert posted.returncode == 0, posted.stderr
    status = run_soulfleet("status", "--json", env=up.env)
    assert status.returncode == 0, status.stderr
    assert '"persona": "nora"' in status.stdout
    memory = up.data / "personas" / "nora" / "MEMORY.md"
    wait_until(lambda: up.alive() and "- the test was here" in memory.read_text("utf-8"),
               timeout=DEADLINE, what="the posted memory write")  # fmt: skip


def test_the_embedded_redis_refuses_a_client_without_credentials(up: Up) -> None:
    """`up --flower` guards Flower with a password so that other processes on the machine
    cannot drive the fleet; the embedded Redis on a loopback TCP port must not let them do
    it more directly (read every inbox, post items marked trusted, which a persona obeys as
    its operator's). A client that knows only the port `up.json` names is refused."""
    wait_until(lambda: up.alive() and (up.data / "up.json").exists(), timeout=DEADLINE,
               what="up.json")  # fmt: skip
    state = json.loads((up.data / "up.json").read_text("utf-8"))
    port = int(state["redis_url"].rsplit(":", 1)[1].split("/", 1)[0])
    stranger = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        with pytest.raises(redis.AuthenticationError):
            stranger.ping()
    finally:
        stranger.close()


def test_up_shows_the_demo_within_a_minute_and_sigint_stops_every_child(up: Up) -> None:
    """The demo surfaces a beat, counts a silent one, writes memory and logs a dream; SIGINT then
    stops every child process and `up` exits 0."""
    nora = up.data / "personas" / "nora"

    def shown() -> bool:
        text = up.text()
        return (
            up.alive()
            and "beat    ava: Reminder: stand up, stretch, and drink a glass of water" in text
            and "silent  milo: heartbeat answered HEARTBEAT_OK" in text
            and "memory  nora wrote MEMORY.md (add)" in text
            and "dream   nora: dream pass logged to memory/log.md" in text
            and "soulfleet up started this fleet at" in (nora / "MEMORY.md").read_text("utf-8")
            and (nora / "memory" / "log.md").is_file()
        )

    wait_until(shown, timeout=DEADLINE, interval=0.5, what="the demo's first minute")
    assert "dream pass" in (nora / "memory" / "log.md").read_text("utf-8")
    children = descendants(up.process.pid)
    commands = [child.cmdline for child in children]
    assert any("redis-server" in cmd for cmd in commands), commands
    assert any("celery -A workers worker" in cmd for cmd in commands), commands
    assert any("celery -A workers beat" in cmd for cmd in commands), commands
    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(timeout=120) == 0, up.text()
    survivors = [child for child in children if child.alive()]
    assert survivors == [], f"children survived: {survivors}"
    assert not (up.data / "up.json").exists()
    assert "soulfleet up: stopped." in up.text()


def _worker_pid(running: Up) -> int | None:
    workers = [
        c for c in descendants(running.process.pid) if "celery -A workers worker" in c.cmdline
    ]
    return workers[0].pid if workers else None


def test_a_child_that_dies_is_restarted_and_up_goes_on(tmp_path: Path) -> None:
    """SIGKILL of the worker (an OOM kill): `up` names it, starts it again and keeps running;
    the new worker gets the fleet's turns; up.json lists the new pid."""
    with start_up(tmp_path) as running:
        wait_until(lambda: running.alive() and "ready   worker-1" in running.text(),
                   timeout=DEADLINE, what="worker-1 ready")  # fmt: skip
        first = _worker_pid(running)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: "worker-1 exited unexpectedly (code -9); restarting it" in
                   running.text(), timeout=DEADLINE, what="the restart")  # fmt: skip
        wait_until(lambda: _worker_pid(running) not in (None, first), timeout=DEADLINE,
                   what="a new worker")  # fmt: skip
        assert running.alive()
        new = _worker_pid(running)

        def recorded() -> list[int]:
            return list(json.loads((running.data / "up.json").read_text())["children"])

        # up.json is rewritten just after the new worker is spawned, not before.
        wait_until(lambda: new in recorded(), timeout=DEADLINE, what="up.json naming it")
        assert first not in recorded()


def test_a_child_that_keeps_dying_stops_up(tmp_path: Path) -> None:
    """A worker killed again after each of its restarts: after RESTARTS restarts within the
    window `up` says so, stops beat and Redis, and exits 1."""
    with start_up(tmp_path) as running:
        wait_until(lambda: running.alive() and "ready   worker-1" in running.text(),
                   timeout=DEADLINE, what="worker-1 ready")  # fmt: skip
        children = descendants(running.process.pid)
        killed: list[int] = []
        while running.alive() and len(killed) <= RESTARTS:
            pid = _worker_pid(running)
            if pid is not None and pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.1)
        assert running.process.wait(timeout=120) == 1, running.text()
        assert f"for the {RESTARTS + 1}th time within" in running.text()
        assert [c for c in children if c.alive()] == []
        assert not (running.data / "up.json").exists()


def test_the_demo_welcome_is_posted_on_the_first_start_only(tmp_path: Path) -> None:
    """Each start posted nora another identical `remember: soulfleet up started ...` item, and
    MEMORY.md grew a line per start: now only the start that copies the demo posts it."""
    memory = tmp_path / "xdg" / "soulfleet" / "personas" / "nora" / "MEMORY.md"
    with start_up(tmp_path) as first:
        wait_until(lambda: first.alive() and "memory  nora wrote MEMORY.md (add)" in first.text(),
                   timeout=DEADLINE, what="the welcome written")  # fmt: skip
        first.process.send_signal(signal.SIGINT)
        assert first.process.wait(timeout=120) == 0, first.text()
    with start_up(tmp_path, output_name="up2.out") as second:
        wait_until(lambda: second.alive() and "is sweeping schedules" in second.text(),
                   timeout=DEADLINE, what="the second start")  # fmt: skip
        assert "posted  nora" not in second.text()
        second.process.send_signal(signal.SIGINT)
        assert second.process.wait(timeout=120) == 0, second.text()
    assert memory.read_text("utf-8").count("soulfleet up started this fleet at") == 1


def test_a_data_folder_reused_with_another_personas_root_is_warned_about(tmp_path: Path) -> None:
    """The data folder's Redis keeps lanes by persona name: starting `up` on it with another
    personas root says so in the banner (same-named personas would share lane state)."""
    with start_up(tmp_path) as first:
        wait_until(lambda: first.alive() and "ready   worker-1" in first.text(),
                   timeout=DEADLINE, what="the first up")  # fmt: skip
        # beat records the root it serves on its first registry sync, before it sweeps
        wait_until(lambda: "is sweeping schedules" in first.text(), timeout=DEADLINE,
                   what="beat sweeping")  # fmt: skip
        first.process.send_signal(signal.SIGINT)
        assert first.process.wait(timeout=120) == 0, first.text()
    other = tmp_path / "other"
    (other / "zed").mkdir(parents=True)
    with start_up(tmp_path, "--personas", str(other), output_name="up2.out") as second:
        wait_until(lambda: second.alive() and "personas" in second.text(),
                   timeout=DEADLINE, what="the second banner")  # fmt: skip
        assert "WARNING   this Redis last served personas from" in second.text()
        second.process.send_signal(signal.SIGINT)
        second.process.wait(timeout=120)


def test_up_with_an_unreachable_redis_url_says_to_unset_it_not_to_run_up(
    tmp_path: Path, dead_redis_env: Mapping[str, str | None]
) -> None:
    """With REDIS_URL pointing at a Redis that does not answer, `up` fails naming REDIS_URL
    (password masked) and says how to get the embedded Redis instead; the generic advice
    ("start one with `soulfleet up`") was circular for a user who had just run it."""
    result = run_soulfleet("up", "--data", str(tmp_path / "data"), env=dead_redis_env)
    assert result.returncode == 1, result.stderr
    assert "(REDIS_URL) is unavailable" in result.stderr
    assert "unset REDIS_URL" in result.stderr
    assert "start one with `soulfleet up`" not in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


def test_up_refuses_more_workers_than_one_host_runs(tmp_path: Path) -> None:
    """`--workers` is bounded (1 to 32): `--workers 1000` started processes, 200 threads each,
    until stopped; now it is a usage error before anything starts."""
    env = subprocess_env({"REDIS_URL": None, "XDG_DATA_HOME": str(tmp_path / "xdg")})
    result = run_soulfleet("up", "--workers", "1000", "--data", str(tmp_path / "data"), env=env)
    assert result.returncode == 2, result.stderr
    assert "1<=x<=32" in result.stderr
    assert not (tmp_path / "data").exists()


def test_up_with_a_missing_personas_root_refuses_before_making_the_data_folder(
    tmp_path: Path,
) -> None:
    """`--personas` (or SOULFLEET_PERSONAS) naming no directory is a usage error that names it,
    before the data folder (its logs, Redis and lock) is made."""
    env = _clean_env(tmp_path / "xdg")
    for args, extra in (
        (["--personas", str(tmp_path / "missing")], {}),
        ([], {"SOULFLEET_PERSONAS": str(tmp_path / "missing")}),
    ):
        result = run_soulfleet("up", "--data", str(tmp_path / "data"), *args,
                               env=subprocess_env({**env, **extra}))  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert f"personas root {tmp_path / 'missing'} does not exist" in result.stderr
        assert not (tmp_path / "data").exists()


_NO_HARD_LINKS = """
import errno, os
def _refuse(src, dst, **_):
    raise OSError(errno.EPERM, "Operation not permitted", src, None, dst)
os.link = _refuse  # as on a filesystem without hard links
"""


@pytest.mark.integration
def test_up_in_shared_lock_mode_refuses_personas_without_hard_links(tmp_path: Path) -> None:
    """`SOULFLEET_LOCK_MODE=shared soulfleet up` on a personas directory whose filesystem
    refuses hard links exits 1 naming the problem and the way out, before starting a child."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_NO_HARD_LINKS)
    data = tmp_path / "data"
    env: dict[str, str | None] = {
        "REDIS_URL": None,
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "SOULFLEET_LOCK_MODE": "shared",
        "PYTHONPATH": str(site),
    }
    done = run_soulfleet("up", "--data", str(data), env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "filesystem without hard links (Operation not permitted)" in done.stderr
    assert "use SOULFLEET_LOCK_MODE=local there" in done.stderr
    assert not list(data.rglob("worker-*.log"))


def test_a_dead_embedded_redis_stops_up_and_says_what_was_lost(tmp_path: Path) -> None:
    """SIGKILL of the embedded redis-server: `up` names it, says the fleet stops and how to
    start it again on the same data, stops its children and exits 1; it does not claim an AOF
    flush that a dead Redis could not do."""
    with start_up(tmp_path) as running:
        wait_until(lambda: running.alive() and "ready   worker-1" in running.text(),
                   timeout=DEADLINE, what="worker-1 ready")  # fmt: skip
        servers = [c for c in descendants(running.process.pid) if "redis-server" in c.cmdline]
        assert len(servers) == 1, servers
        children = descendants(running.process.pid)
        os.kill(servers[0].pid, signal.SIGKILL)
        assert running.process.wait(timeout=120) == 1, running.text()
        text = running.text()
        assert "the embedded redis-server exited unexpectedly (code -9" in text
        assert "`soulfleet up` again restarts it on the same data" in text
        assert "redis had already exited (code -9)" in text
        assert "AOF flushed" not in text
        assert "REDIS_URL" not in text  # the beats feed's generic advice does not apply
        assert [c for c in children if c.alive()] == []


def test_a_restart_on_a_full_disk_does_not_stop_the_fleet_over_up_json(tmp_path: Path) -> None:
    """The data disk fills up and a child dies (beat's log write fails, or an OOM kill of the
    worker): `up` restarts it, then fails to rewrite up.json with the new pid and had stopped
    the WHOLE fleet over that file, saying only "[Errno 28] No space left on device". The
    file only lists pids; `up` names it and runs on, and the fleet outlives the full disk."""
    with tmpfs(tmp_path / "xdg" / "soulfleet", "64m") as disk, start_up(tmp_path) as running:
        wait_until(lambda: running.alive() and "is sweeping schedules" in running.text()
                   and "ready   worker-1" in running.text(),
                   timeout=DEADLINE, what="the fleet ready")  # fmt: skip
        filler = fill(disk, leave=0)
        worker = _worker_pid(running)
        assert worker is not None
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: "exited unexpectedly" in running.text()
                   or running.process.poll() is not None,
                   timeout=DEADLINE, what="the restart")  # fmt: skip
        time.sleep(1.0)
        filler.unlink()  # the operator frees space
        time.sleep(3.0)
        text = running.text()
        assert running.process.poll() is None, text
        assert "up.json" in text, text
        running.process.send_signal(signal.SIGINT)
        assert running.process.wait(timeout=120) == 0, running.text()


def test_up_on_a_full_data_disk_says_which_folder_is_full(tmp_path: Path) -> None:
    """`up` on a data folder whose disk is full exited 1 with only "[Errno 28] No space left on
    device": no word of which folder or what it was writing. It names the data folder."""
    with tmpfs(tmp_path / "disk", "2m") as disk:
        fill(disk, leave=0)
        env = subprocess_env({"REDIS_URL": None, "XDG_DATA_HOME": str(tmp_path / "xdg")})
        done = run_soulfleet("up", "--data", str(disk / "data"), env=env, timeout=120)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "No space left on device" in done.stderr, done.stderr
        assert str(disk / "data") in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_up_on_its_own_redis_rides_out_a_redis_restart(tmp_path: Path) -> None:
    """`up` with REDIS_URL (the user's own Redis, not one it started): Redis killed for longer
    than a status line's interval and started again. `up` stopped the whole fleet on the
    first status line it could not read; now it says once that Redis does not answer, then
    that it answers again, and its children run on."""
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    try:
        with start_up(tmp_path, "--workers", "1", redis_url=server.url) as running:
            wait_until(lambda: running.alive() and " status  " in running.text(),
                       timeout=DEADLINE)  # fmt: skip
            server.stop()
            wait_until(lambda: running.alive() and "status unavailable" in running.text(),
                       timeout=DEADLINE)  # fmt: skip
            server = RedisServer(tmp_path / "redis", port=server.port, persistent=True).start()
            wait_until(lambda: running.alive() and "Redis answers again" in running.text(),
                       timeout=DEADLINE)  # fmt: skip
            assert running.text().count("status unavailable") == 1
            assert "beats feed interrupted" in running.text()
            running.process.send_signal(signal.SIGINT)
            assert running.process.wait(timeout=DEADLINE) == 0, running.text()
    finally:
        server.stop()


def test_a_second_up_on_the_same_personas_root_is_refused(tmp_path: Path) -> None:
    """Another `up` (from another data folder, on its own Redis) serving the same personas root
    would beat every persona again and overwrite its sessions: while one holds the root (an
    flock on the directory, held here as a running `up` holds it), a second is refused, names
    the root, and starts nothing; once it is let go, `up` gets past that check."""
    root = tmp_path / "root"
    (root / "ava").mkdir(parents=True)
    held = lock_personas_root(root)
    try:
        result = run_soulfleet("up", "--data", str(tmp_path / "data"), "--personas", str(root),
                               env=subprocess_env(_clean_env(tmp_path / "xdg")))  # fmt: skip
        assert result.returncode == 1, result.stderr
        assert f"another soulfleet up serves the personas root {root}" in result.stderr
        assert not (tmp_path / "data" / "redis" / "redis.log").exists()
        assert not (tmp_path / "data" / "up.json").exists()
    finally:
        held.release()


def test_up_refuses_one_personas_directory_as_its_root(tmp_path: Path) -> None:
    """`--personas` naming one persona's own directory would schedule its sessions/,
    transcripts/ and memory/ as personas: refused, naming the folder to pass instead."""
    persona = tmp_path / "root" / "bob"
    persona.mkdir(parents=True)
    (persona / "SOUL.md").write_text("I am Bob.\n", encoding="utf-8")
    result = run_soulfleet("up", "--data", str(tmp_path / "data"), "--personas", str(persona),
                           env=subprocess_env(_clean_env(tmp_path / "xdg")))  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "looks like one persona's directory" in result.stderr
    assert f"--personas {tmp_path / 'root'}" in result.stderr
    assert not (tmp_path / "data").exists()


def test_empty_directory_options_are_refused_not_taken_for_here(tmp_path: Path) -> None:
    """`--data "$UNSET"` wrote up's Redis, logs and personas into the current directory, and
    `--personas "$UNSET"` served every folder in it: an empty value is a usage error."""
    env = subprocess_env(_clean_env(tmp_path / "xdg"))
    for args in (["up", "--data", ""], ["up", "--personas", " "], ["status", "--personas", ""]):
        result = run_soulfleet(*args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert "is empty (an unset shell variable?)" in result.stderr

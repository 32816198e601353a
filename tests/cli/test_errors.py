"""How the CLI fails: the exit code per kind of error, one line, never a password."""

from __future__ import annotations

from pathlib import Path

import redis
from kombu.exceptions import OperationalError

from tests.support.cli import run_soulfleet, subprocess_env
from workers.cli.errors import (
    EXIT_FAILURE,
    EXIT_USAGE,
    BadInputError,
    CliError,
    one_line,
    translate,
)
from workers.fleet.errors import InboxFull, LaneDeadLettered, UnknownPersona
from workers.local.redis_server import RedisServer
from workers.persona.errors import ModelSpecError, PersonaConfigError, SettingsError


def test_bad_input_maps_to_exit_2() -> None:
    """Unknown persona, invalid persona.toml, invalid settings, bad model spec: exit 2."""
    for exc in (
        UnknownPersona("ghost", "/p"),
        PersonaConfigError("/p/persona.toml", "heartbeat.every", "bad"),
        SettingsError("SOULFLEET_INBOX_MAX", "must be a whole number"),
        ModelSpecError("unknown model spec 'x'"),
    ):
        error = translate(exc)
        assert isinstance(error, BadInputError), exc
        assert error.exit_code == EXIT_USAGE


def test_runtime_failures_map_to_exit_1() -> None:
    """Inbox full, dead-lettered lane, timeouts and Redis trouble: exit 1."""
    for exc in (
        InboxFull("ava", 3),
        LaneDeadLettered("ava", "boom"),
        TimeoutError("no answer"),
        PermissionError(13, "Permission denied", "/root/x"),
        redis.ResponseError("OOM command not allowed"),
    ):
        error = translate(exc)
        assert error is not None, exc
        assert not isinstance(error, BadInputError), exc
        assert error.exit_code == EXIT_FAILURE


def test_connection_errors_name_the_url_without_password() -> None:
    """A raw redis or broker connection error becomes the RedisUnavailable line, password hidden."""
    url = "redis://user:hunter2@10.1.2.3:6380/0"
    for exc in (
        redis.ConnectionError("Error 111 connecting to 10.1.2.3:6380. Connection refused."),
        OperationalError("cannot reach redis://user:hunter2@10.1.2.3:6380/0"),
    ):
        error = translate(exc, redis_url=url)
        assert error is not None
        assert "hunter2" not in error.message
        assert "redis://user:***@10.1.2.3:6380/0" in error.message
        assert "soulfleet up" in error.message


def test_messages_are_one_line_and_bugs_are_not_translated() -> None:
    """Multi-line messages are collapsed; an unexpected exception is left to its traceback."""
    error = CliError("first line\n  second line")
    assert error.message == "first line second line"
    assert translate(KeyError("bug")) is None


def test_a_full_redis_says_so_and_what_to_do() -> None:
    """A refusal by a Redis at its maxmemory (alone or inside a pipeline's error) names the
    cause and the fix, not only Redis's own words."""
    for exc in (
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        redis.ResponseError(
            "Command # 1 (HGETALL k) of pipeline caused error: OOM command not allowed when "
            "used memory > 'maxmemory'."
        ),
    ):
        error = translate(exc)
        assert error is not None
        assert error.message.startswith("Redis is full")
        assert "CONFIG SET maxmemory" in error.message
        assert "runbook" in error.message


def test_a_file_error_names_the_path_then_the_reason_without_python_errno() -> None:
    """An OSError a command meets (`init /proc/nope`, `up --data` on a full disk) reads
    "PATH: reason", not Python's "[Errno 2] No such file or directory: 'PATH'"; a rename
    names both paths; one without a path is its reason alone."""
    missing = translate(FileNotFoundError(2, "No such file or directory", "/proc/nope"))
    assert missing is not None
    assert missing.message == "/proc/nope: No such file or directory"
    assert missing.exit_code == EXIT_FAILURE
    moved = translate(OSError(18, "Invalid cross-device link", "/a", None, "/b"))
    assert moved is not None
    assert moved.message == "/a -> /b: Invalid cross-device link"
    bare = translate(OSError(28, "No space left on device"))
    assert bare is not None
    assert bare.message == "No space left on device"


def test_a_redis_refusing_the_password_says_to_check_the_password(tmp_path: Path) -> None:
    """A Redis with requirepass, reached without the password or with a wrong one: the line
    said "check that it runs" (it does: it answered), not that the credentials were refused.
    It names the password in REDIS_URL now, never showing it; a Redis that is down still
    gets the old advice."""
    with RedisServer(tmp_path / "redis", password="s3cretpw") as server:
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        for url in (f"redis://127.0.0.1:{port}/0", f"redis://:wrongpw@127.0.0.1:{port}/0"):
            result = run_soulfleet("status", env=subprocess_env({"REDIS_URL": url}))
            assert result.returncode == 1, result.stderr
            assert "refused this client's credentials: check the password" in result.stderr
            assert "check that it runs" not in result.stderr
            assert "wrongpw" not in result.stderr
    down = run_soulfleet("status", env=subprocess_env({"REDIS_URL": f"redis://127.0.0.1:{port}/0"}))
    assert down.returncode == 1
    assert "check that it runs" in down.stderr


def test_a_long_error_is_cut_at_a_whole_word_and_says_so() -> None:
    """`run` cut a lane's error at 300 characters mid-word ("restart the workers to load t"):
    one_line with a limit cuts at a whole word and ends with an ellipsis; a short one is kept."""
    error = "a module is imported once per worker process, so restart the workers to load the edit"
    cut = one_line(error, 72)
    assert cut == "a module is imported once per worker process, so restart the workers to …"
    assert one_line("short\n error", 72) == "short error"
    assert one_line("x" * 100, 10) == "x" * 10 + " …"
    assert one_line("aaa bbb ccc", 7) == "aaa bbb …"  # a word ending at the limit is whole

"""How the CLI fails: exit codes, and one clear line instead of a traceback.

Exit codes (the README documents them):

====  =============================================================================
0     success (``up``: stopped by Ctrl-C / SIGTERM after a clean shutdown)
1     runtime failure: Redis unreachable, inbox full, lane dead-lettered, a turn that
      failed or did not answer in time, `up` already running, a child of `up` died, a
      file that cannot be read or written, a Python tool's import still running at its
      time limit (transient)
2     usage or bad input: unknown option or persona, invalid persona.toml (the key is
      named), invalid settings (the variable is named), a model spec naming no model,
      files `init` would overwrite
====  =============================================================================

Why a translation layer: the core raises precise exceptions whose messages already say what
happened and what to do (and never contain a password); the CLI's job is only to pick the exit
code and print the message on ONE line, prefixed so it is obviously soulfleet speaking. Anything
else (a real bug) keeps its traceback, because hiding one helps nobody.
"""

from __future__ import annotations

from typing import IO, Any

import click
import redis
from kombu.exceptions import OperationalError as BrokerError

from workers.fleet.errors import ItemTooLarge, RedisUnavailable, UnknownPersona, is_redis_full
from workers.persona.errors import (
    ModelSpecError,
    PersonaError,
    SettingsError,
    SoulfleetError,
)
from workers.persona.urls import scrub
from workers.settings import redact_url

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "BadInputError",
    "CliError",
    "translate",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

# Bad input: the user can fix it by changing what they typed or the files they point at.
_USAGE_ERRORS: tuple[type[BaseException], ...] = (
    UnknownPersona,
    ItemTooLarge,
    SettingsError,
    ModelSpecError,
    PersonaError,  # PersonaNotFound, PersonaConfigError (names the key), PersonaFileError
)


def one_line(text: str, limit: int | None = None) -> str:
    """Collapse a message onto one line (TOML errors and stack-ish details carry newlines);
    with ``limit``, at most that many characters, cut at a whole word and saying so (an
    error cut mid-word read as another word)."""
    line = " ".join(str(text).split())
    if limit is None or len(line) <= limit:
        return line
    head = line[: limit + 1]  # a space right after the limit: the last word is whole
    cut = head.rsplit(" ", 1)[0] if " " in head else line[:limit]
    return cut + " …"


class CliError(click.ClickException):
    """A runtime failure, reported as ``soulfleet: error: <one line>``; exit 1."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"soulfleet: error: {self.format_message()}", file=file, err=file is None)


class BadInputError(CliError):
    """Usage or bad input (unknown persona, invalid persona.toml or settings); exit 2."""

    exit_code = EXIT_USAGE


def translate(exc: BaseException, *, redis_url: str | None = None) -> CliError | None:
    """The CliError for a known failure, or None for anything that is a bug.

    ``redis_url`` names the Redis a raw redis-py or kombu error came from; it is shown without
    its password, and that password is scrubbed from the whole message as a last line of
    defence (a library may quote the URL it was given).
    """
    error = _translate(exc, redis_url)
    if error is not None and redis_url:
        scrubbed = scrub(error.message, redis_url)
        if scrubbed != error.message:
            return type(error)(scrubbed)
    return error


def _translate(exc: BaseException, redis_url: str | None) -> CliError | None:
    message: str | None = None
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, PersonaError) and exc.retryable:
        # Not bad input (ToolSetupSlow: an import still running at its limit): trying again
        # later may succeed, and the fleet's workers retry it; a runtime failure, exit 1.
        return CliError(f"{exc} (transient: try again)")
    if isinstance(exc, _USAGE_ERRORS):
        return BadInputError(str(exc))
    if isinstance(exc, SoulfleetError):  # FleetError (RedisUnavailable, InboxFull …), LockTimeout
        message = str(exc)
    elif isinstance(exc, (redis.ConnectionError, redis.TimeoutError, BrokerError)):
        # Publishing a turn goes through kombu: a broker it cannot reach is the same failure
        # as Redis being down, and gets the same message.
        url = redact_url(redis_url) if redis_url else "the configured Redis"
        message = str(RedisUnavailable(url, one_line(str(exc))))
    elif is_redis_full(exc):
        message = (
            f"Redis is full (used memory over its maxmemory) and refuses writes: "
            f"{one_line(str(exc)).rstrip('.')}. Give it room "
            "(`redis-cli CONFIG SET maxmemory <more>`), "
            'then find what grew: ops/runbook.md "Redis memory near its limit"'
        )
    elif isinstance(exc, redis.RedisError) and "DB index is out of range" in str(exc):
        url = redact_url(redis_url) if redis_url else "the configured Redis URL"
        message = (
            f"Redis refused the database that REDIS_URL selects ({url}): it has fewer databases "
            "(see its `databases` setting, 16 by default: 0-15); use one of them"
        )
    elif isinstance(exc, redis.RedisError):
        message = f"Redis refused a command: {exc}"
    elif isinstance(exc, TimeoutError):
        message = str(exc) or "timed out"
    elif isinstance(exc, OSError):
        # A file the command needs or writes (permissions, a full disk): its path, then the
        # system's words, without Python's "[Errno 2]" in front.
        message = _os_error(exc)
    return None if message is None else CliError(message)


def _os_error(exc: OSError) -> str:
    """``exc`` as a person reads it: ``PATH: reason`` (``PATH -> OTHER: reason`` for a rename)."""
    reason = exc.strerror or str(exc)
    if exc.filename is None:
        return reason
    where = str(exc.filename)
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    return f"{where}: {reason}"

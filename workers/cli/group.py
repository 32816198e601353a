"""The ``soulfleet`` command group: shared options, quiet logging, and error translation.

Every command runs inside :meth:`SoulfleetGroup.invoke`, which turns the core's exceptions into
one ``soulfleet: error: ...`` line and the documented exit code (:mod:`workers.cli.errors`), so no
command repeats a try/except and no user ever sees a traceback for bad input.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import redis
import structlog

from workers.cli.context import CliContext
from workers.cli.errors import BadInputError, CliError, translate
from workers.fleet.errors import RedisFull, RedisUnavailable
from workers.local.datadir import pid_alive
from workers.persona.errors import causes
from workers.settings import redact_url

__all__ = [
    "JSON_FAILURE_SHOWN",
    "DirectoryPath",
    "SoulfleetGroup",
    "calls_the_model",
    "cli_context",
    "personas_option",
    "quiet_logging",
]

F = TypeVar("F", bound=Callable[..., Any])

#: ``ctx.meta`` key of the group's own arguments (the command's name and its arguments).
COMMAND_LINE = "soulfleet.command_line"
#: ``ctx.meta`` key a command sets once it has printed its own JSON account of a failure.
JSON_FAILURE_SHOWN = "soulfleet.json_failure_shown"


def calls_the_model(ctx: click.Context) -> bool:
    """The invoked command calls the model from this process (``up``, whose workers are its
    children, and ``run --local``) instead of leaving it to the fleet's workers."""
    line: tuple[str, ...] = ctx.meta.get(COMMAND_LINE, ())
    command = ctx.invoked_subcommand
    return command == "up" or (command == "run" and "--local" in line)


class SoulfleetGroup(click.Group):
    """A click group whose commands fail with one clear line instead of a traceback.

    A reader that leaves early (``soulfleet beats --json | head -1``) is a normal way to use a
    command's output, not a failure: the command stops quietly with exit 0, as ``cat`` does,
    instead of click's "Broken pipe" and exit 1.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Every argument of every command, checked at the door: a byte that is not UTF-8
        # (which Python keeps as a lone surrogate) fails wherever the text is first encoded,
        # deep in a command and after it may have written something (`init` left a
        # half-made persona).
        for arg in args:
            refusal = _not_utf8(arg)
            if refusal is not None:
                raise BadInputError(refusal)
        ctx.meta[COMMAND_LINE] = tuple(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _quiet_stdout()
            raise click.exceptions.Exit(0) from None
        except CliError as exc:
            _json_failure(ctx, exc)
            raise
        except (click.exceptions.Exit, click.Abort, click.ClickException):
            raise
        except Exception as exc:
            state = ctx.find_object(CliContext)
            error = translate(exc, redis_url=state.redis_url if state else None)
            if error is None:
                raise
            up = state.adopted if state is not None else None
            if up is not None and up.embedded_redis and _unreachable(exc):
                # This shell's REDIS_URL is not set: the Redis was the running `up`'s.
                if _timed_out(exc) and pid_alive(up.pid):  # its Redis is paused or busy
                    error = CliError(
                        f"the `soulfleet up` this command found (data {up.data}, pid {up.pid}) "
                        f"is running, but its Redis at {redact_url(up.redis_url)} did not "
                        f"answer ({error.format_message()}): paused, busy with a slow command "
                        "or out of memory? Try again in a moment (`up`'s own output says more)"
                    )
                else:
                    error = CliError(
                        f"the `soulfleet up` this command found (data {up.data}, pid {up.pid}) "
                        f"no longer answers at {redact_url(up.redis_url)}: it has stopped; "
                        "start it again (`soulfleet up`)"
                    )
            _json_failure(ctx, error)
            raise error from exc


def _json_failure(ctx: click.Context, error: CliError) -> None:
    """With ``--json``, a failure is also one JSON object on stdout (``error``, ``exit``): a
    script reading stdout learns why, not only the exit status (the line on stderr stays)."""
    line: tuple[str, ...] = ctx.meta.get(COMMAND_LINE, ())
    options = line[: line.index("--")] if "--" in line else line  # not a PROMPT "--json"
    if "--json" in options and not ctx.meta.get(JSON_FAILURE_SHOWN):
        click.echo(json.dumps({"error": error.format_message(), "exit": error.exit_code}))


def _unreachable(exc: BaseException) -> bool:
    """Redis did not answer at all (not: answered full)."""
    if isinstance(exc, RedisUnavailable):
        return not isinstance(exc, RedisFull)
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError))


def _timed_out(exc: BaseException) -> bool:
    """Redis was reached but did not answer in time (paused, busy), as opposed to refusing
    the connection (its process gone): told by the exception or what it was raised from."""
    return any(
        isinstance(cause, (redis.TimeoutError, TimeoutError)) for cause in causes(exc, context=True)
    )


def _not_utf8(arg: str) -> str | None:
    """Why ``arg`` cannot be taken (None when it is UTF-8 text)."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = os.fsencode(arg).decode("utf-8", "backslashreplace")
        byte = ord(arg[exc.start]) - 0xDC00  # surrogateescape keeps byte b as U+DC00 + b
        return (
            f"argument '{shown}' is not UTF-8 text (byte {byte:#04x}): names, messages and "
            "paths given to soulfleet must be UTF-8"
        )
    return None


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (an embedding program's stream)
        pass


def quiet_logging(level: str | None = None) -> None:
    """Log lines go to stderr at WARNING and above (DEBUG with SOULFLEET_LOG_LEVEL=debug),
    never into a command's stdout, which scripts parse.

    Called by the console-script entry point only: configuring logging belongs to a process,
    and a program embedding the CLI's group (a test run, a worker) keeps its own.
    """
    chosen = (level if level is not None else os.environ.get("SOULFLEET_LOG_LEVEL", "")).lower()
    threshold = logging.DEBUG if chosen == "debug" else logging.WARNING
    structlog.configure(
        processors=[
            structlog.stdlib.add_log_level,
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
    )


def cli_context(ctx: click.Context, personas: Path | None = None) -> CliContext:
    """This invocation's :class:`CliContext`, with ``--personas`` applied if given."""
    state = ctx.ensure_object(CliContext)
    if personas is not None:
        state.personas = personas
    return state


class DirectoryPath(click.Path):
    """A directory option's value, refused when empty: ``Path("")`` is the current directory,
    so ``--personas "$UNSET"`` made every folder here a persona and ``up --data "$UNSET"``
    wrote its Redis, logs and personas into it."""

    def __init__(self) -> None:
        super().__init__(file_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("is empty (an unset shell variable?): name a directory", param, ctx)
        return super().convert(value, param, ctx)


def personas_option(func: F) -> F:
    """``--personas DIR``: the personas root (overrides SOULFLEET_PERSONAS and `up`'s)."""
    option = click.option(
        "--personas",
        type=DirectoryPath(),
        default=None,
        help="Personas root (default: SOULFLEET_PERSONAS, else the running `up`'s).",
    )
    return option(func)

"""The ``soulfleet`` command line: one command to a running fleet, and the tools around it.

::

    soulfleet up [--personas DIR] [--workers N] [--flower] [--data DIR]
    soulfleet init DIR
    soulfleet soul DIR [--json]
    soulfleet tools PERSONA [--json]
    soulfleet run PERSONA PROMPT [--new-session] [--local] [--model SPEC] [--json]
    soulfleet post PERSONA TEXT [--wake/--no-wake] [--from NAME] [--channel C]
    soulfleet status [PERSONA] [--json]
    soulfleet beats [--follow] [--json]
    soulfleet dream PERSONA | --all
    soulfleet revive PERSONA [--dreamer] [--drop-kept]
    soulfleet session show PERSONA [--json] | session reset PERSONA
    soulfleet usage [NAME] [--top N] [--days N] [--json]

One module per command, each thin: parse, call the core (:class:`workers.fleet.Fleet`, the
persona core), report. Which fleet a command reaches is :mod:`workers.cli.context`; how it fails
(one line, documented exit codes) is :mod:`workers.cli.errors`.
"""

from __future__ import annotations

import click

from workers.cli.beats import beats
from workers.cli.context import CliContext
from workers.cli.dream import dream
from workers.cli.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from workers.cli.group import SoulfleetGroup, calls_the_model, quiet_logging
from workers.cli.init import init
from workers.cli.post import post
from workers.cli.revive import revive
from workers.cli.run import run
from workers.cli.session import session
from workers.cli.soul import soul
from workers.cli.status import status
from workers.cli.tools import tools
from workers.cli.up import up
from workers.cli.usage import usage
from workers.settings import Settings

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "cli", "main"]

_EPILOG = """\b
Exit status: 0 ok, 1 runtime failure (Redis unreachable, inbox full, failed turn,
`up` already running), 2 usage or bad input (unknown persona, invalid persona.toml
or settings).
PERSONA is a name under the personas root or a path to a persona directory.
Without REDIS_URL, commands reach the `soulfleet up` running on the default data
directory; with neither, they say no fleet is running (exit 2)."""


@click.group(
    cls=SoulfleetGroup, epilog=_EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="soulfleet", prog_name="soulfleet")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """soulfleet: file-defined persona agents, run as a fleet on Celery + Redis."""
    state = ctx.ensure_object(CliContext)
    ctx.call_on_close(state.close)
    # Errors at the door: every setting is checked before any command does anything (exit 2
    # naming the variable), including commands that would not otherwise read it. A default
    # model this shell cannot reach (no key here) is only a warning: the workers call it, and
    # may well have the key. `up` and `run --local`, which call it, refuse it themselves: no
    # warning about the workers first.
    settings = Settings.from_env(state.environ, model_reach=False)
    if settings.model.unreachable and not calls_the_model(ctx):
        click.echo(
            f"soulfleet: warning: {settings.model.unreachable} (the workers need it; "
            "this command does not)",
            err=True,
        )


for _command in (up, init, soul, tools, run, post, status, beats, dream, revive, session, usage):
    cli.add_command(_command)


def main() -> None:
    """The command line (the console script, :mod:`workers.command`, calls it)."""
    quiet_logging()
    cli.main(prog_name="soulfleet")

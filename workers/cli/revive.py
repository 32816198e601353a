"""``soulfleet revive PERSONA [--dreamer]``: take a dead-lettered lane back into service.

A lane is dead-lettered after SOULFLEET_MAX_ATTEMPTS failed or crashed turns in a row; its
items are kept. Fix the cause first (``soulfleet status PERSONA`` shows the last error), then
revive: the attempt count resets and one turn is queued, which runs the kept items first.
"""

from __future__ import annotations

from pathlib import Path

import click

from workers.cli.errors import EXIT_FAILURE
from workers.cli.group import cli_context, personas_option

__all__ = ["revive"]


@click.command()
@click.argument("persona")
@click.option("--dreamer", is_flag=True, help="Revive the persona's dreamer lane instead.")
@personas_option
@click.pass_context
def revive(ctx: click.Context, *, persona: str, dreamer: bool, personas: Path | None) -> None:
    """Queue a dead-lettered lane of PERSONA again (its kept items run first)."""
    state = cli_context(ctx, personas)
    name = state.persona(persona)
    outcome = state.fleet().revive(name, dreamer=dreamer)
    if outcome.outcome != "queued":
        click.echo(f"soulfleet: error: lane {outcome.lane} is not dead-lettered", err=True)
        ctx.exit(EXIT_FAILURE)
    click.echo(f"revived {outcome.lane}: turn {outcome.turn_id} queued")

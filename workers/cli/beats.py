"""``soulfleet beats [--follow] [--json]``: what personas surfaced on their heartbeats.

Reads the fleet's beats stream (:class:`workers.fleet.beats.Beats`): the newest ``--count`` beats,
oldest first, then with ``--follow`` every new one as it is committed, until Ctrl-C or SIGTERM
(exit 0).
``--json`` prints one JSON object per line (JSON Lines), so ``--follow --json`` streams into
``jq`` or a script without waiting for an end that never comes.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import FrameType

import click

from workers.cli.errors import BadInputError
from workers.cli.group import DirectoryPath, cli_context
from workers.fleet.beats import Beat, Beats

__all__ = ["beats", "format_beat"]


def format_beat(beat: Beat, *, as_json: bool = False) -> str:
    """One beat as a terminal line (``HH:MM:SS persona: text``) or a JSON object."""
    if as_json:
        return json.dumps(
            {
                "id": beat.id,
                "persona": beat.persona,
                "text": beat.text,
                "turn_id": beat.turn_id,
                "time": beat.time,
            },
            ensure_ascii=False,
        )
    stamp = time.strftime("%H:%M:%S", time.localtime(beat.time)) if beat.time else "--:--:--"
    return f"{stamp} {beat.persona}: {' '.join(beat.text.split())}"


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _stop_on_sigint_and_sigterm() -> None:
    """Make SIGINT and SIGTERM end ``--follow`` cleanly, whatever the process inherited.

    A shell starts a background job (``soulfleet beats --follow &``, a CI step) with SIGINT
    ignored, and an ignored signal survives exec, so Python's KeyboardInterrupt handler is never
    installed: the documented way to stop following would do nothing.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)


def _not_negative(value: int) -> int:
    if value < 0:
        raise click.BadParameter(f"{value} is negative: give how many beats to print (0 or more)")
    return value


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing new beats until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    # Clamped above: past Redis's 64-bit COUNT, a huge -n was a "Redis refused a command"
    # error. Not below: a negative -n clamped to 0 printed nothing without a word.
    "--count", "-n", type=click.IntRange(max=2**62, clamp=True), default=20,
    callback=lambda _ctx, _param, value: _not_negative(value),
    show_default=True, help="How many recent beats to print first (all: a large number).",
)  # fmt: skip
# Accepted only to refuse it with the reason (the feed is fleet-wide), so not in --help.
@click.option("--personas", type=DirectoryPath(), hidden=True)
@click.pass_context
def beats(
    ctx: click.Context, follow: bool, as_json: bool, count: int, personas: Path | None
) -> None:
    """Print recent surfaced beats; with --follow, keep printing new ones."""
    if personas is not None:
        raise BadInputError(
            "beats --personas: the beats feed is the whole fleet's, whatever the personas root; "
            "drop --personas (filter by persona with `soulfleet beats --json | jq`)"
        )
    fleet = cli_context(ctx, personas).fleet()
    recent = fleet.beats(count=count)
    for beat in recent:
        click.echo(format_beat(beat, as_json=as_json))
    if not follow:
        if not recent and not as_json and count > 0:
            click.echo("no surfaced beats yet", err=True)
        return
    _stop_on_sigint_and_sigterm()
    feed = Beats(fleet.client, fleet.keys)
    cursor = recent[-1].id if recent else feed.last_id()
    try:
        for beat in feed.follow(cursor, block_ms=2000):
            click.echo(format_beat(beat, as_json=as_json))
    except KeyboardInterrupt:
        return

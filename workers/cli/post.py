"""``soulfleet post PERSONA TEXT``: deliver one inbox item through the host API.

A thin wrapper over :meth:`workers.fleet.Fleet.post`, the same call any inbound channel makes:
the item keeps its provenance (``--from``, ``--channel``; provenance only: the item is
untrusted unless ``--trusted``) and, with ``--wake`` (the default),
queues a turn if the persona is idle. A full inbox is refused loudly (exit 1), never dropped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from workers.cli.errors import EXIT_FAILURE, BadInputError, one_line
from workers.cli.group import cli_context, personas_option
from workers.cli.health import heartbeat_unread, quiet_hours

__all__ = ["post"]


@click.command()
@click.argument("persona")
@click.argument("text")
@click.option("--wake/--no-wake", default=True, show_default=True, help="Queue a turn now.")
@click.option("--from", "sender", default="cli", show_default=True, help="Sender name.")
@click.option("--channel", default="cli", show_default=True, help="Channel the item came in on.")
@click.option(
    "--trusted",
    is_flag=True,
    help="Render the item as the persona's own side (outside the UNTRUSTED block). Only for "
    "text you wrote yourself; --from never decides trust.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@personas_option
@click.pass_context
def post(
    ctx: click.Context,
    *,
    persona: str,
    text: str,
    wake: bool,
    sender: str,
    channel: str,
    trusted: bool,
    as_json: bool,
    personas: Path | None,
) -> None:
    """Put TEXT in PERSONA's inbox (and wake it unless --no-wake)."""
    if not text.strip():
        raise BadInputError("TEXT is empty: nothing to post (to wake a persona, `soulfleet dream` "
                            "or its heartbeat; to read it, `soulfleet status`)")  # fmt: skip
    state = cli_context(ctx, personas)
    state.honour_personas("post")
    name = state.checked(persona)
    outcome = state.fleet().post(
        name, text, sender=sender, channel=channel, wake=wake, trusted=trusted
    )
    # A turn takes the item without beat: one it queued, or the lane's queued or running one.
    queued = outcome.outcome == "queued" or (outcome.outcome == "pending" and wake)
    if as_json:
        state.warn_if_no_fleet(turn_queued=queued)
        unwoken = (
            _unwoken(state.fleet().registry.home(name)).removeprefix("; ")
            if outcome.outcome == "pending" and not wake
            else ""
        )
        click.echo(json.dumps({
            "persona": name, "lane": outcome.lane, "item_id": outcome.item_id,
            "outcome": outcome.outcome, "turn_id": outcome.turn_id, "depth": outcome.depth,
            "unsent": outcome.unsent, "resend_soon": outcome.resend_soon,
            # --no-wake with no heartbeat that will read the item: why (else null)
            "no_heartbeat_reads_it": unwoken or None,
        }))  # fmt: skip
        if outcome.outcome == "dead":  # kept, but no turn reads it until a revive: exit 1
            ctx.exit(EXIT_FAILURE)
        return
    if outcome.outcome == "queued" and outcome.unsent is not None:
        # Accepted all the same: posting again would put the item in twice.
        when = (
            "at its next pass (SOULFLEET_REAP_INTERVAL)"
            if outcome.resend_soon
            else "once the turn has waited SOULFLEET_REAP_QUEUED_AFTER"
        )
        what = (
            f"turn {outcome.turn_id} queued, but its wake-up could not be sent "
            f"({one_line(outcome.unsent)}); beat's reaper sends it {when}. Do not post again"
        )
    elif outcome.outcome == "queued":
        what = f"turn {outcome.turn_id} queued"
    elif outcome.outcome == "dead":
        what = (
            f"lane is dead-lettered: the item is kept (do not post it again), and no turn reads "
            f"it until `soulfleet revive {name}` (`soulfleet status {name}` says why it died)"
        )
    elif wake:
        what = "waiting for the next turn"
    else:
        what = "not woken (--no-wake)" + _unwoken(state.fleet().registry.home(name))
    click.echo(f"posted to {name} (item {outcome.item_id}, inbox depth {outcome.depth}): {what}")
    state.warn_if_no_fleet(turn_queued=queued)
    if outcome.outcome == "dead":
        ctx.exit(EXIT_FAILURE)


def _outside_active_hours(home: Path) -> str:
    """What a ``--no-wake`` item waits for when the persona is outside its heartbeat's
    ``active_hours`` now (no heartbeat comes until the window opens); "" otherwise."""
    hours = quiet_hours(home, time.time())
    if hours is None:
        return ""
    return (
        f"; it is outside its heartbeat.active_hours now ({hours.start:%H:%M}-"
        f"{hours.end:%H:%M} {hours.timezone}), so the item waits for the first heartbeat "
        "after the window opens, or a post that wakes it"
    )


def _unwoken(home: Path) -> str:
    """What a ``--no-wake`` item waits for when the persona's next heartbeat will not read it:
    it has none, or every one is skipped for its HEARTBEAT.md (a persona fresh from
    ``soulfleet init`` has a blank one); "" when a heartbeat will come (or its files are
    invalid, which the check-up said)."""
    skip = heartbeat_unread(home)
    if skip is None:
        return _outside_active_hours(home)
    if skip == "no_heartbeat":
        return "; it has no heartbeat, so the item waits for the next post that wakes it"
    return (
        f"; every heartbeat of it is skipped ({skip}: see its HEARTBEAT.md), so the item waits "
        "for the next post that wakes it"
    )

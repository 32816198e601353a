"""``soulfleet revive PERSONA [--dreamer]`` / ``revive --all [--reason TEXT]``: take
dead-lettered lanes back into service.

A lane is dead-lettered by a permanent failure (at once: 401/403, an unknown model, invalid
persona files), by transient failures that lasted ``SOULFLEET_RETRY_FOR``, or by
``SOULFLEET_MAX_ATTEMPTS`` crashed or unclassified attempts in a row; its items are kept. Fix
the cause first (``soulfleet status PERSONA`` shows the last error), then revive: the attempt
count resets and one turn is queued, which runs the kept items first. After a fleet-wide
incident, ``--all`` revives every dead lane, and ``--reason TEXT`` only those whose last error
contains TEXT (case-insensitive), e.g. ``--reason "HTTP 401"`` once the key is fixed. A lane
whose persona's files still fail the check ``post`` makes is not revived (a single ``revive``
exits 2 with the error; ``--all`` names it and goes on): it would only die again. A dead lane
whose persona directory is gone is never revived; ``--forget-gone`` removes such lanes and the
items they kept (otherwise they stay dead-lettered, and in the alert, for ever).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from workers.cli.context import CliContext
from workers.cli.errors import EXIT_FAILURE, BadInputError
from workers.cli.group import cli_context, personas_option
from workers.fleet.outcomes import TickOutcome
from workers.persona.python_tools import STALE_IMPORT

__all__ = ["revive"]


@click.command()
@click.argument("persona", required=False)
@click.option("--dreamer", is_flag=True, help="Revive the persona's dreamer lane instead.")
@click.option("--all", "every", is_flag=True, help="Revive every dead-lettered lane.")
@click.option(
    "--reason",
    metavar="TEXT",
    help="Revive only dead lanes whose last error contains TEXT (implies --all).",
)
@click.option(
    "--forget-gone",
    is_flag=True,
    help="Remove dead lanes whose persona directory is gone, with their kept items.",
)
@click.option(
    "--drop-kept",
    is_flag=True,
    help="Drop the items the dead turn held instead of running them again (a message the "
    "provider refuses for good); items posted since still run.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@personas_option
@click.pass_context
def revive(
    ctx: click.Context,
    *,
    persona: str | None,
    dreamer: bool,
    every: bool,
    reason: str | None,
    forget_gone: bool,
    drop_kept: bool,
    as_json: bool,
    personas: Path | None,
) -> None:
    """Queue a dead-lettered lane of PERSONA again (its kept items run first); a lane
    waiting out a retry backoff runs now."""
    state = cli_context(ctx, personas)
    state.honour_personas("revive")
    if forget_gone:
        if persona is not None or dreamer or every or reason is not None:
            raise BadInputError("--forget-gone takes no PERSONA, --dreamer, --all or --reason")
        _forget_gone(state, as_json=as_json)
        return
    if drop_kept and (every or reason is not None):
        raise BadInputError("--drop-kept takes one PERSONA (and --dreamer), not --all/--reason")
    if every or reason is not None:
        if persona is not None or dreamer:
            raise BadInputError("give PERSONA (and --dreamer) or --all/--reason, not both")
        _revive_all(state, reason, as_json=as_json)
        return
    if persona is None:
        raise BadInputError("name a PERSONA to revive, or pass --all or --reason TEXT")
    # The check `post` makes, warnings included (a model key this shell lacks: the lane it
    # revives may die again on it).
    name = state.checked(persona)
    _warn_if_stale_import(state, name, dreamer=dreamer)
    outcome = state.fleet().revive(name, dreamer=dreamer, drop_kept=drop_kept)
    queued = outcome.outcome == "queued"
    _report(state, outcome, name, drop_kept=drop_kept, as_json=as_json)
    if not queued and not outcome.kind.startswith("reindexed_"):
        ctx.exit(EXIT_FAILURE)


def _warn_if_stale_import(state: CliContext, name: str, *, dreamer: bool) -> None:
    """The check above passes a tool module edited since a worker imported it (this process
    imports it fresh), and the revived lane died again at once: say what fixes it."""
    fleet = state.fleet()
    lane = fleet.registry.lane_of(name, "dreamer" if dreamer else "persona")
    error = str(fleet.lanes.status(lane).get("last_error") or "")
    if STALE_IMPORT in error:
        click.echo(
            f"soulfleet: warning: {lane} died because a worker held an older import of a tool "
            "module (its last error says so): unless the workers were restarted since, the "
            "revived turn fails the same way; restart them first",
            err=True,
        )


def _report(
    state: CliContext, outcome: TickOutcome, name: str, *, drop_kept: bool, as_json: bool
) -> None:
    """What ``revive PERSONA`` did, plain or as JSON."""
    queued = outcome.outcome == "queued"
    if as_json:
        answer: dict[str, object] = {
            "lane": outcome.lane, "revived": queued, "turn_id": outcome.turn_id,
            "items_dropped": outcome.dropped,
        }  # fmt: skip
        if outcome.kind.startswith("reindexed_"):
            answer["reason"] = _put_back(outcome)
        elif not queued:
            answer["reason"] = "not dead-lettered"
            # A failure in --json is an {"error", "exit"} object like every command's.
            answer["error"] = _not_dead(state, outcome.lane, name)
            answer["exit"] = EXIT_FAILURE
        elif outcome.kind == "retry_now":
            answer["reason"] = "was waiting out a retry backoff: queued now"
        click.echo(json.dumps(answer))
        return
    dropped = (
        f"; {outcome.dropped} item(s) the failed turn held dropped (their senders get no reply)"
        if drop_kept
        else ""
    )
    if outcome.kind.startswith("reindexed_"):
        click.echo(f"put back {outcome.lane}: {_put_back(outcome)}")
    elif queued and outcome.kind == "retry_now":
        click.echo(
            f"lane {outcome.lane} was waiting out a retry backoff after a failed try: turn "
            f"{outcome.turn_id} queued now{dropped}"
        )
    elif queued:
        click.echo(f"revived {outcome.lane}: turn {outcome.turn_id} queued{dropped}")
    else:
        click.echo(f"soulfleet: error: {_not_dead(state, outcome.lane, name)}", err=True)


def _not_dead(state: CliContext, lane: str, name: str) -> str:
    now = state.fleet().lanes.status(lane).get("state") or "idle"
    return (
        f"lane {lane} is not dead-lettered (it is {now}): nothing to revive "
        f"(`soulfleet status {name}` shows it)"
    )


def _revive_all(state: CliContext, reason: str | None, *, as_json: bool) -> None:
    if reason is not None and not reason.strip():
        raise BadInputError("--reason needs some text to match in the last error")
    fleet = state.fleet()
    revived, broken = fleet.revive_dead(reason=reason)
    orphans = fleet.orphaned_dead()
    # --all also puts back the lanes `status` names as lost from the queue index
    put_back = fleet.requeue_unindexed() if reason is None else []
    if as_json:
        lanes = [{"lane": outcome.lane, "turn_id": outcome.turn_id} for outcome in revived]
        still = [{"lane": lane, "error": error} for lane, error in broken]
        back = [{"lane": outcome.lane, "turn_id": outcome.turn_id} for outcome in put_back]
        click.echo(json.dumps({"revived": lanes, "reason": reason, "persona_gone": orphans,
                               "still_broken": still, "put_back": back}))  # fmt: skip
        return
    for outcome in put_back:
        click.echo(f"put back {outcome.lane}: {_put_back(outcome)}")
    for outcome in revived:
        click.echo(f"revived {outcome.lane}: turn {outcome.turn_id} queued")
    matching = f" whose last error contains {reason!r}" if reason is not None else ""
    click.echo(f"revived {len(revived)} dead-lettered lane(s){matching}")
    for lane, error in broken:
        click.echo(f"not revived: {lane}, whose files still fail: {' '.join(error.split())}")
    if orphans:
        click.echo(
            f"not revived: {len(orphans)} dead lane(s) whose persona directory is gone "
            f"({', '.join(orphans)}); they would only fail again. Restore the directory under "
            f"{fleet.registry.root} to revive one, or remove them with "
            "`soulfleet revive --forget-gone`."
        )


def _forget_gone(state: CliContext, *, as_json: bool) -> None:
    forgotten = state.fleet().forget_gone()
    if as_json:
        click.echo(json.dumps({"forgotten": [{"lane": lane, "items_dropped": n}
                                             for lane, n in forgotten]}))  # fmt: skip
        return
    for lane, dropped in forgotten:
        click.echo(f"forgot {lane}: its persona directory is gone; {dropped} kept item(s) dropped")
    click.echo(f"forgot {len(forgotten)} dead lane(s) of removed personas")


def _put_back(outcome: TickOutcome) -> str:
    """What putting a lane lost from its index back did (``revive.lua``)."""
    if outcome.kind == "reindexed_running":
        return ("running but lost from the running index; back in it: beat's reaper takes the "
                "lane back at its next pass once its turn's lease is gone")  # fmt: skip
    if outcome.kind == "reindexed_retry":
        return ("retrying but lost from the retry index; back in it: beat releases it at its "
                "retry time")  # fmt: skip
    if outcome.kind == "reindexed_deferred":
        return ("deferred but lost from its provider's index; back in it: it resumes once the "
                "provider's breaker lets it")  # fmt: skip
    return f"lost from its index; turn {outcome.turn_id} sent again"

"""``soulfleet dream PERSONA | --all``: wake dreamers now instead of at their schedule.

``dream PERSONA`` ticks one persona's dreamer lane (:meth:`workers.fleet.Fleet.dream`) and
says whether a pass was queued or folded into one already queued or running.

``dream --all`` ticks every persona's dreamer in pipelined round trips, then watches the batch:
a lane is DONE when its ``last_turn`` differs from the one recorded before the tick (a pass
committed), FAILED when it is dead-lettered (a failing pass is retried by the fleet until
SOULFLEET_MAX_ATTEMPTS, so a single error is not yet a failure), and STILL RUNNING if neither
happened within ``--timeout``. A persona whose files fail the check-up that ``dream PERSONA``
runs is not ticked: it is named with its reason and counted as invalid. Exit status 1 if any
failed, is still running or is invalid.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

import click
import redis

from workers.cli.context import CliContext
from workers.cli.errors import EXIT_FAILURE, BadInputError, CliError, one_line
from workers.cli.group import cli_context, personas_option
from workers.fleet import Fleet
from workers.fleet.spend import next_reset
from workers.persona.checkup import check_persona
from workers.persona.errors import ModelError, PersonaError, SoulfleetError, ToolSetupSlow

__all__ = ["dream", "watch_batch"]


def watch_batch(
    fleet: Fleet,
    before: Mapping[str, str | None],
    *,
    timeout: float,
    poll: float = 0.5,
) -> tuple[dict[str, str], list[str], list[str]]:
    """Poll dreamer lanes until each pass ended or failed; return (ended, failed, still
    running), ``ended`` mapping each lane to the status its pass ended with (done, skipped).

    ``before`` maps each lane to its ``last_turn`` before the tick. A lane is failed once it is
    dead-lettered; a pass that failed and waits for its retry is still running. A pass's status
    is read when its end is first seen: a scheduled pass ending later (while the batch waits
    for others) must not stand in for it. The progress bar goes to stderr, so stdout carries
    only the summary.
    """
    pending = dict(before)
    ended: dict[str, str] = {}
    failed: list[str] = []
    deadline = time.monotonic() + timeout
    with _progress(len(pending)) as bar:
        while pending:
            for lane, last in list(pending.items()):
                state = fleet.lanes.status(lane)
                # Dead first: the turn that dead-letters a lane also moves its last_turn. An
                # attempt that failed and will be retried is still running.
                if state.get("state") == "dead":
                    failed.append(lane)
                elif state.get("last_turn") != last and state.get("last_status") != "error":
                    ended[lane] = str(state.get("last_status") or "done")
                else:
                    continue
                del pending[lane]
                bar.update(1)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(poll)
    return ended, failed, sorted(pending)


class _Bar(Protocol):
    def update(self, n_steps: int) -> None: ...


class _NoBar:
    def update(self, n_steps: int) -> None:
        pass


def _progress(length: int) -> AbstractContextManager[_Bar]:
    """A progress bar on a terminal's stderr; elsewhere none (click printed its bare label,
    a stray "dreaming" line in a log or a pipe)."""
    if not sys.stderr.isatty():
        return nullcontext(_NoBar())
    return click.progressbar(length=length, label="dreaming", file=sys.stderr)


@click.command()
@click.argument("persona", required=False)
@click.option("--all", "all_personas", is_flag=True, help="Every persona under the root.")
@click.option(
    "--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
    help="--all: seconds to wait for the batch (0: wake them and report at once).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@personas_option
@click.pass_context
def dream(
    ctx: click.Context,
    *,
    persona: str | None,
    all_personas: bool,
    timeout: float,
    as_json: bool,
    personas: Path | None,
) -> None:
    """Run a dream pass for PERSONA now, or for every persona with --all."""
    if (persona is None) == (not all_personas):
        raise BadInputError("give either PERSONA or --all (not both, not neither)")
    state = cli_context(ctx, personas)
    state.honour_personas("dream")
    if persona is not None:
        _dream_one(ctx, state, persona, as_json=as_json)
    else:
        _dream_all(ctx, state, timeout=timeout, as_json=as_json)


def _dream_one(ctx: click.Context, state: CliContext, persona: str, *, as_json: bool) -> None:
    name = state.checked(persona)
    outcome = state.fleet().dream(name)
    if outcome.outcome != "dead_lettered":
        _warn_if_budget_skips(state, name)
        _warn_if_nothing_new(state, name)
    if as_json:
        click.echo(json.dumps({
            "persona": name, "lane": outcome.lane, "outcome": outcome.outcome,
            "turn_id": outcome.turn_id,
        }))  # fmt: skip
        if outcome.outcome == "dead_lettered":
            ctx.exit(EXIT_FAILURE)
        return
    if outcome.outcome == "queued":
        click.echo(f"dream pass queued for {name} (lane {outcome.lane}, turn {outcome.turn_id})")
    elif outcome.outcome == "coalesced":
        lane_state = state.fleet().lanes.status(outcome.lane).get("state")
        waits = {
            "deferred": "waits for its provider's breaker to close (`soulfleet status` names it)",
            "retry": "waits out a retry after a failure (`soulfleet status` says why)",
        }.get(str(lane_state), "is already queued or running")
        click.echo(f"{name}: a dream pass {waits}; this tick joins it")
    else:
        raise CliError(f"lane {outcome.lane} is dead-lettered: `soulfleet status {name}` says why")


def _warn_if_nothing_new(state: CliContext, name: str) -> None:
    """Say so when nothing was written since the persona's last pass: the worker skips the
    pass just queued (``nothing_new``), and "dream pass queued" was all this said."""
    try:
        last = state.fleet().last_pass_if_nothing_new(name)
    except (SoulfleetError, redis.RedisError, OSError, ValueError):  # the pass is queued: a
        return  # hint, no more (ValueError: a last_pass field someone wrote by hand)
    if last is not None:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last))
        click.echo(
            f"soulfleet: warning: nothing was written for {name} since its last dream pass "
            f"(ended {at}): no conversation and no note, so the pass will be skipped (reason "
            "nothing_new) without a model call; it dreams once something new is written",
            err=True,
        )


def _warn_if_budget_skips(state: CliContext, name: str) -> None:
    """Say so when the persona's used-up daily budget will skip the pass just queued (it said
    only "dream pass queued", and the pass was skipped without a word here)."""
    fleet = state.fleet()
    try:
        refusal = fleet.budget_refusal(name, "dream")
    except (SoulfleetError, redis.RedisError, OSError):  # the pass is queued: a hint, no more
        return
    if refusal is not None:
        budget, spent = refusal
        click.echo(
            f"soulfleet: warning: {name}'s daily budget is used up ({spent:,} of "
            f"{budget.daily_tokens:,} tokens, on_exceed = {budget.on_exceed!r}): the pass will "
            f"be skipped, until {next_reset(budget, fleet.clock.time())}",
            err=True,
        )


def _dream_all(ctx: click.Context, state: CliContext, *, timeout: float, as_json: bool) -> None:
    fleet = state.fleet()
    names = fleet.registry.names()
    if not names:
        raise BadInputError(f"no personas in {fleet.registry.root}")
    # The same check-up as `dream PERSONA`: a persona whose files are invalid could only fail
    # its pass until its dreamer is dead-lettered. Skipped, named with the reason, and counted.
    invalid: dict[str, str] = {}
    for name in names:
        try:
            check_persona(
                fleet.registry.home(name),
                state.settings.model,
                mcp_servers=state.fleet_mcp_servers(),
            )
        except ToolSetupSlow as exc:  # transient: its pass is queued, and retried
            click.echo(f"soulfleet: warning: {name}: {exc}; queued all the same", err=True)
        except (PersonaError, ModelError) as exc:
            invalid[name] = str(exc)
            click.echo(f"soulfleet: skipped {name}: {exc}", err=True)
    names = [name for name in names if name not in invalid]
    lanes = [fleet.registry.lane_of(name, "dreamer") for name in names]
    before = {lane: _str(fleet.lanes.status(lane).get("last_turn")) for lane in lanes}
    outcomes = fleet.tick_lanes([(lane, "dream") for lane in lanes])
    dead = [o.lane for o in outcomes if o.outcome == "dead_lettered"]
    watched = {lane: last for lane, last in before.items() if lane not in dead}
    # Said up front: with output not on a terminal (no progress bar), a batch job waited up to
    # --timeout in silence.
    click.echo(
        f"dreaming: {len(watched)} dreamers woken ({len(dead)} dead-lettered); waiting up to "
        f"{timeout:.0f}s (--timeout) for their passes",
        err=True,
    )
    ended, failed, waiting = watch_batch(fleet, watched, timeout=timeout)
    failed = sorted([*failed, *dead])
    # A pass that ended without a model call (a used-up budget, nothing new) did not dream.
    skipped = sorted(lane for lane, status in ended.items() if status == "skipped")
    # One that ended at a limit (its input over the turn budget, its time or calls used up)
    # did not finish its pass: not done, and the command fails.
    incomplete = sorted(lane for lane, status in ended.items() if status == "incomplete")
    done = sorted(lane for lane in ended if lane not in skipped and lane not in incomplete)
    # A lane whose provider's breaker is open waits for it, not for a worker: said apart.
    # So is one still queued (no worker has taken it: busy, or none consuming the dream
    # queue), which was called "still running".
    statuses = {lane: fleet.lanes.status(lane) for lane in waiting}
    states = {lane: status.get("state") for lane, status in statuses.items()}
    deferred = [lane for lane in waiting if states[lane] == "deferred"]
    queued = [lane for lane in waiting if states[lane] == "queued"]
    # A pass that failed and waits out its backoff is not running: said apart, with its error.
    retrying = [lane for lane in waiting if states[lane] == "retry"]
    running = [lane for lane in waiting if lane not in {*deferred, *queued, *retrying}]
    if as_json:
        click.echo(json.dumps({
            "done": done, "skipped": skipped, "incomplete": incomplete, "failed": failed,
            "still_running": running, "retrying": retrying,
            "still_queued": queued, "deferred": deferred, "invalid": invalid,
        }))  # fmt: skip
    else:
        click.echo(
            f"done: {len(done)}  skipped: {len(skipped)}  incomplete: {len(incomplete)}  "
            f"failed: {len(failed)}  "
            f"still running: {len(running)}  retrying: {len(retrying)}  "
            f"still queued: {len(queued)}  "
            f"deferred: {len(deferred)}  invalid (not queued): {len(invalid)}"
        )
        for label, group in (("skipped (budget used up, or nothing new)", skipped),
                             ("incomplete (ended at a limit: `soulfleet status` says which)",
                              incomplete),
                             ("failed", failed), ("still running", running),
                             ("still queued (no worker has taken them yet)", queued),
                             ("deferred (their provider's breaker is open: they run when it "
                              "closes; `soulfleet status` names it)", deferred),
                             ("invalid", sorted(invalid))):  # fmt: skip
            if group:
                click.echo(f"{label}: {', '.join(group)}")
        for lane in retrying:
            error = one_line(str(statuses[lane].get("last_error") or "?"), 200)
            click.echo(f"retrying (a try failed; the fleet tries again after a backoff): {lane}: "
                       f"{error}")  # fmt: skip
    if failed or waiting or invalid or incomplete:
        ctx.exit(EXIT_FAILURE)


def _str(value: object) -> str | None:
    return None if value is None else str(value)

"""``soulfleet status [PERSONA] [--json]``: what the fleet's lanes are doing.

A table for people, ``--json`` for scripts (the same fields :meth:`workers.fleet.Fleet.status`
returns, plus ``invalid`` and ``error``). Without PERSONA: every persona under the root, plus the
fleet-wide lane counts (lanes waiting out a retry backoff or an open provider breaker included),
one line per provider breaker, and when beat last swept (a beat that stopped sweeping means no
heartbeats, no dreams and no retries). ``--state dead`` (or failing, retry, deferred, running,
queued, idle, invalid) keeps only the personas one of whose lanes is in that state: the rows
that matter in a fleet of thousands. Invalid personas (as beat's registry sync recorded them),
errors that still apply and dead lanes a configuration fix made runnable again are
:mod:`workers.cli.health`'s. Colours (dead red, failing, retry and invalid yellow) only on a
terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import click

from workers.cli.beat_health import (
    beat_stale,
    beat_summary,
    last_sweep_at,
    redis_data_lost,
    root_conflict,
    root_conflict_line,
)
from workers.cli.context import CliContext
from workers.cli.errors import BadInputError, CliError
from workers.cli.group import cli_context, personas_option
from workers.cli.health import (
    dead_causes,
    fixed_since,
    heartbeat_unread,
    invalid_personas,
    lanes_of,
    quiet_hours,
    states_of,
)
from workers.cli.session import edited_note
from workers.cli.status_table import ago, annotate, row, table, until
from workers.cli.worker_health import QUEUED_TOO_LONG, unserved_kinds
from workers.fleet import Fleet
from workers.fleet.breaker import BreakerState
from workers.fleet.errors import is_redis_blip
from workers.fleet.eviction import evicts
from workers.fleet.registry import DREAMER_SUFFIX
from workers.fleet.spend import next_reset, persona_budget
from workers.persona.edits import EDIT_GRACE_SECONDS
from workers.persona.errors import ModelAuthError, SoulfleetError, causes
from workers.persona.locks import shared_claims_under
from workers.queues import queue_name

__all__ = [
    "STATES",
    "breaker_lines",
    "invalid_personas",
    "lock_claims",
    "status",
]

STATES = ("dead", "failing", "retry", "deferred", "running", "queued", "idle", "invalid")
#: A breaker's last error that no amount of waiting cures (the probe's key was refused).
_KEY_REFUSED = f"{ModelAuthError.__name__}:"
#: Used memory over this share of maxmemory gets its own line (the SoulfleetRedisMemoryHigh
#: alert fires at 0.8; a line only nearer the edge, where posts start being refused).
MEMORY_HIGH = 0.9


def breaker_lines(
    states: Sequence[BreakerState],
    now: float | None = None,
    *,
    lost: Mapping[str, int] | None = None,
) -> list[str]:
    """One line per provider breaker: OPEN ones say since when, when the next probe is due,
    how many lanes wait and why; closed ones are summed up in one line. ``lost``: per
    provider, its deferred lanes lost from their index (not counted as deferred)."""
    now = time.time() if now is None else now
    lost = lost or {}
    lines: list[str] = []
    for state in states:
        if not state.open:
            continue
        probe = "probing now" if state.probing else f"next probe {until(state.probe_at, now)}"
        error = " ".join(state.last_error.split()) or "-"
        if len(error) > 200:  # whole words, and said to be cut (it stopped mid-parenthesis)
            error = error[:200].rsplit(" ", 1)[0] + " …"
        if state.last_error.startswith(_KEY_REFUSED):
            # A refused key never closes the breaker (only a success does), and each probe
            # dead-letters the lane it ran: waiting changes nothing.
            resume = (
                "they do NOT resume until the provider accepts the key: each probe "
                "dead-letters one; ops/runbook.md 'Rotating a model key', then "
                "`soulfleet revive --reason ModelAuthError` (the lanes the refused key killed)"
            )
        else:
            resume = "they resume by themselves"
        if lost.get(state.provider):
            # "0 deferred, they resume by themselves" beside the lost-lanes line: no probe
            # finds a lane to run until they are put back.
            resume += (
                f"; and {lost[state.provider]} more lost from the deferred index, which resume "
                "only once `soulfleet revive --all` puts them back"
            )
        lines.append(
            f"breaker {state.provider}: OPEN since {ago(state.opened_at, now)}, {probe}, "
            f"{state.deferred} lane(s) deferred ({resume}); last error: {error}"
        )
    closed = [state.provider for state in states if not state.open]
    if closed or not lines:
        names = (
            ", ".join(closed)
            if closed
            else "no provider call counted yet; a request refused as invalid, such as HTTP 400, "
            "says nothing of the provider and is not counted"
        )
        lines.append(f"breakers: closed ({names})")
    return lines


def lock_claims(fleet: Fleet, names: Sequence[str]) -> list[dict[str, str]]:
    """Claims on shared-mode memory locks: what blocks a persona's memory writes. Looked for
    whatever this shell's SOULFLEET_LOCK_MODE says (the workers' may differ). Dead writers of
    this machine are cleared automatically, so a claim listed for long is a live writer or a
    crashed one on ANOTHER machine (clear it with ``break_shared_lock`` once that process is
    known gone)."""
    return [
        {"persona": name, "file": data, "holder": holder}
        for name in names
        for data, holder in shared_claims_under(fleet.registry.home(name))
    ]


def _echo_claims(claims: Sequence[Mapping[str, str]]) -> None:
    if claims:
        click.echo(
            f"shared-mode lock claims ({len(claims)}; one whose writer died on another machine, "
            "or where flock is missing, stays until cleared: ops/runbook.md 'Lock timeouts on "
            "a shared filesystem'):"
        )
        for claim in claims:
            click.echo(f"  {claim['persona']} {claim['file']}: {claim['holder']}")


def _states(entry: Mapping[str, Any]) -> set[str]:
    states = states_of(entry)
    dreamer = entry.get("dreamer")
    if isinstance(dreamer, Mapping):
        states |= states_of({**dreamer, "invalid": entry.get("invalid")})
    return states


def _echo_models(entry: Mapping[str, Any]) -> None:
    """The model each kind of turn goes to (one persona's view)."""
    models = entry.get("models")
    if models:
        click.echo("models: " + ", ".join(f"{kind} {spec}" for kind, spec in models.items()))


@click.command()
@click.argument("persona", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--state", "only", type=click.Choice(STATES), default=None,
    help="Only personas with a lane in this state (failing = retrying after an error).",
)  # fmt: skip
@personas_option
@click.pass_context
def status(
    ctx: click.Context, persona: str | None, as_json: bool, only: str | None, personas: Path | None
) -> None:
    """Show PERSONA's lanes, or every persona's plus fleet-wide counts."""
    if persona is not None and only is not None:
        # One persona's rows are all shown: a filter that kept them anyway would mislead.
        raise click.UsageError(
            f"--state filters the listing of every persona; drop it to see {persona!r}'s lanes, "
            f"or drop {persona!r} to list the personas with a lane in state {only}"
        )
    state = cli_context(ctx, personas)
    foreign = state.foreign_root_warning()
    if foreign is not None:
        click.echo(f"soulfleet: warning: {foreign}", err=True)
    if persona is not None:
        _status_one(state, persona, as_json=as_json)
    else:
        _status_all(state, only, as_json=as_json, foreign=foreign is not None)


def _status_one(state: CliContext, persona: str, *, as_json: bool) -> None:
    name = state.persona(persona)
    fleet = state.fleet()
    invalid = invalid_personas(fleet, [name])
    entry = annotate(fleet.status(name), invalid, fleet.registry.root, fleet.settings.lease_ttl)
    _mark_unindexed([entry], fleet.lanes.unindexed(_indexed_lanes([entry])))
    why = invalid.get(name)
    claims = lock_claims(fleet, [name])
    if claims:
        entry["lock_claims"] = claims
    used_up = budget_used_up(fleet, name, entry)
    if used_up is not None:
        entry["budget_used_up"] = used_up
    if (skipped := _heartbeat_skipped(fleet.registry.home(name))) is not None:
        entry["heartbeat_skipped"] = skipped
    quiet = quiet_hours(fleet.registry.home(name), fleet.clock.time())
    if quiet is not None:
        entry["heartbeat_quiet"] = {
            "start": f"{quiet.start:%H:%M}",
            "end": f"{quiet.end:%H:%M}",
            "timezone": quiet.timezone,
        }
    try:
        session = fleet.session(name)
    except (SoulfleetError, OSError):  # a broken persona.toml, an unreadable state: said below
        session = {}
    entry["session_edited"] = list(session.get("edited") or [])
    click.echo(
        json.dumps(entry, ensure_ascii=False) if as_json else table([row(entry, whole_error=True)])
    )
    if as_json:
        return
    if entry.get("last_text"):
        click.echo(f"last reply: {' '.join(str(entry['last_text']).split())[:200]}")
    if why:
        click.echo(f"INVALID (not scheduled until fixed): {' '.join(why.split())}")
    _echo_claims(claims)
    _echo_models(entry)
    _echo_calls(fleet, name, entry)
    _echo_queued(entry, fleet.clock.time(), state.settings.reap_queued_after)
    _echo_budget(used_up)
    if skipped is not None:
        click.echo(f"heartbeats: {_SKIPPED[skipped]}")
    elif quiet is not None:
        # A LAST TURN of "skipped" said no more: the reason was only in beat's log.
        click.echo(
            f"heartbeats: outside heartbeat.active_hours now ({quiet.start:%H:%M}-"
            f"{quiet.end:%H:%M} {quiet.timezone}): ticks are skipped without a model call "
            "until the window opens (beat logs tick.skipped reason=quiet_hours)"
        )
    if session and (note := edited_note(session)):
        click.echo(f"session: {note}")
    fixed = fixed_since(
        fleet,
        state.settings.model,
        invalid=invalid_personas(fleet),
        mcp_servers=state.fleet_mcp_servers(),
    )
    _dead_hint(entry, name, {lane for lane, _ in fixed})
    _fixed_hint(fixed)


#: What ``status NAME`` says of a persona whose every heartbeat beat skips (beat/skips.py).
_SKIPPED = {
    "no_heartbeat_file": "every tick is skipped: there is no HEARTBEAT.md (beat logs "
    "tick.skipped reason=no_heartbeat_file); put it back to resume",
    "blank_heartbeat": "every tick is skipped without a model call: HEARTBEAT.md asks for "
    "nothing (only headings, comments or empty list items); write what is due in it",
    "invalid_heartbeat_file": "every tick is skipped: something other than a readable file is "
    "at HEARTBEAT.md; replace it with a file",
}


def _heartbeat_skipped(home: Path) -> str | None:
    """Why every heartbeat of the persona at ``home`` is skipped for its HEARTBEAT.md, when it
    has a heartbeat schedule at all; None otherwise (or when its persona.toml is invalid,
    which status says itself)."""
    unread = heartbeat_unread(home)
    return None if unread == "no_heartbeat" else unread


def _echo_calls(fleet: Fleet, name: str, entry: Mapping[str, Any]) -> None:
    """What a running turn waits on: a model call in flight, and for how long (a provider that
    takes calls and never answers showed only as a turn "running"). A call whose worker has
    stopped renewing the lane's lease is said to be orphaned, not waiting: its slot outlives
    a killed worker until it expires."""
    silences = {lane: lane_entry.get("lease_silent") for lane, lane_entry, _ in lanes_of(entry)}
    now = fleet.clock.time()
    for call in fleet.model_calls([name, fleet.registry.lane_of(name, "dreamer")]):
        age = f"{max(0.0, now - call.started):.0f}s"
        silent = silences.get(call.lane)
        if silent is not None:
            click.echo(
                f"model call: lane {call.lane}'s call on worker {call.holder} began {age} ago, "
                f"but the lane's lease has not been renewed for {silent}s: that worker is "
                "probably gone, and the call with it (beat's reaper takes the lane back once "
                "the lease lapses)"
            )
            continue
        click.echo(
            f"model call: lane {call.lane} has waited {age} on its model call (worker "
            f"{call.holder}; its retried tries and their waits included: a provider refusing "
            "calls, HTTP 429 or 5xx, shows as model.retry warnings in that worker's log; it "
            "ends by SOULFLEET_MODEL_TIMEOUT per try and the turn by SOULFLEET_TURN_MAX_SECONDS)"
        )


#: A queued lane older than this is said to wait (a turn is normally taken within seconds).
QUEUED_LONG = 60.0


def _echo_queued(entry: Mapping[str, Any], now: float, reap_after: float) -> None:
    """Why a lane may sit queued for minutes, and when the reaper sends its turn again: a
    message lost as Redis filled or failed over left a persona silent for 10 minutes behind a
    row reading only "queued for 9m", while the workers answered."""
    for lane, lane_entry, _ in lanes_of(entry):
        queued_at = lane_entry.get("queued_at")
        if lane_entry.get("state") != "queued" or not isinstance(queued_at, int | float):
            continue
        waited = now - queued_at
        if waited < QUEUED_LONG:
            continue
        left = reap_after - waited
        when = f"in about {left:.0f}s" if left > 0 else "at its next pass"
        click.echo(
            f"queued: lane {lane} has waited {waited:.0f}s for a worker to take its turn: no "
            "worker consumes its queue, or the workers are busy with a backlog (`soulfleet "
            "status` says which: its workers line, the queued count), or its turn message was "
            "lost (a Redis that was full, restarted or failing over as it was sent); beat's "
            f"reaper sends it again once queued SOULFLEET_REAP_QUEUED_AFTER ({reap_after:.0f}s), "
            f"{when}"
        )


def budget_used_up(fleet: Fleet, name: str, entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a used-up daily budget is doing to the persona now (the tokens column alone did not
    say that its heartbeats were being skipped, or its posts refused), for ``--json`` as
    ``budget_used_up``: spent, daily_tokens, on_exceed, what it skips and until when (ISO 8601
    in the budget's zone). None while the budget lasts (or the persona has none)."""
    daily, spent = entry.get("daily_tokens"), entry.get("tokens_today")
    if not isinstance(daily, int) or not isinstance(spent, int) or spent < daily:
        return None
    try:
        budget = persona_budget(fleet.registry.home(name), fleet.settings)
    except (SoulfleetError, OSError):
        return None
    return {
        "spent": spent,
        "daily_tokens": daily,
        "on_exceed": budget.on_exceed,
        "skips": "every_turn" if budget.on_exceed == "stop" else "heartbeats_and_dreams",
        "until": next_reset(budget, fleet.clock.time()),
    }


def _echo_budget(used_up: Mapping[str, Any] | None) -> None:
    if used_up is None:
        return
    doing = (
        "every turn is refused, posts at the door"
        if used_up["skips"] == "every_turn"
        else "heartbeats and dreams are skipped, conversations still run"
    )
    click.echo(
        f"budget: used up today ({used_up['spent']:,} of {used_up['daily_tokens']:,} tokens, "
        f"on_exceed={used_up['on_exceed']}): {doing}, until {used_up['until']} (raise [budget] "
        "daily_tokens in persona.toml, or SOULFLEET_DAILY_TOKENS, to go on today)"
    )


def _dead_hint(entry: Mapping[str, Any], name: str, fixed: set[str]) -> None:
    """How to take back the persona's dead-lettered lanes (those the fixed-since line does not
    already name): the error above says what to fix."""
    for lane, lane_entry, flag in lanes_of(entry):
        if lane_entry.get("state") == "dead" and lane not in fixed:
            click.echo(
                f"dead: lane {lane} is dead-lettered and runs no turn until revived; fix the "
                f"cause (its error above), then `soulfleet revive {name}{flag}` (its kept items "
                "run then; add --drop-kept to drop the ones its dead turn held, when they are "
                "what failed: a message the provider refuses, HTTP 400)"
            )


def _recorded_lists(
    state: CliContext, *, foreign: bool
) -> tuple[dict[str, str], list[tuple[str, str]], list[str]]:
    """Invalid personas (beat's records), dead lanes whose configuration error is fixed, and
    dead lanes of removed personas. Of a root the fleet's workers do not serve (``foreign``)
    none: beat judged their files, not this root's (a copy of the root made to try an edit
    showed the original's errors for personas fixed in the copy)."""
    fleet = state.fleet()
    if foreign:  # beat never looked at this root's files: nothing it recorded is about them
        return {}, [], []
    invalid = invalid_personas(fleet)
    fixed = fixed_since(
        fleet, state.settings.model, invalid=invalid, mcp_servers=state.fleet_mcp_servers()
    )
    return invalid, fixed, fleet.orphaned_dead()


def _missing_root(state: CliContext, root: Path, *, foreign: bool) -> NoReturn:
    if not foreign and state.fleet_root() == root.expanduser().resolve():
        # The fleet's own root: moved, renamed or unmounted under a running fleet.
        raise CliError(
            f"personas root {root} does not exist, and it is the one the fleet's workers "
            "serve: it was moved, renamed or unmounted while the fleet runs, and beat "
            "schedules none of its personas meanwhile (registry.root_missing in its log): "
            "put it back, or restart the fleet with the new path (SOULFLEET_PERSONAS, `up "
            "--personas`)"
        )
    raise BadInputError(
        f"personas root {root} does not exist (set SOULFLEET_PERSONAS or pass --personas)"
    )


def _status_all(state: CliContext, only: str | None, *, as_json: bool, foreign: bool) -> None:
    """Every persona under the root, and the fleet-wide lists. ``foreign``: the root is not
    the one the fleet's workers serve, so what beat recorded of theirs (invalid personas, dead
    lanes of removed or fixed personas) is not said of this one's."""
    fleet = state.fleet()  # Redis first: with no fleet, the personas root is moot
    root = state.settings.personas
    if not root.is_dir():
        _missing_root(state, root, foreign=foreign)
    names = fleet.registry.names()
    invalid, fixed, orphans = _recorded_lists(state, foreign=foreign)
    # not of this root's personas when it is not the fleet's: its directories decide "gone"
    retrying_gone = [] if foreign else fleet.orphaned_retrying()
    entries = [
        annotate(entry, invalid, fleet.registry.root, fleet.settings.lease_ttl)
        for entry in fleet.statuses(names)
    ]
    shown = [entry for entry in entries if only is None or only in _states(entry)]
    counts = fleet.lanes.counts()
    waiting = fleet.lanes.waiting()
    unindexed = fleet.lanes.unindexed(_indexed_lanes(entries))
    _mark_unindexed(entries, unindexed)
    breakers = fleet.breaker.states()
    beat = beat_summary(fleet)
    claims = lock_claims(fleet, [str(entry["persona"]) for entry in entries])
    unusable = fleet.registry.unusable_names()
    used, limit, policy = fleet.redis_memory()
    full = 0 < limit <= used
    evicting = evicts(policy)
    lost = redis_data_lost(fleet)
    evicted = fleet.redis_evicted_keys()
    unserved = _unserved(state, entries)
    conflict = root_conflict(fleet)
    if as_json:
        payload = {
            "root": str(root),
            "personas": shown,
            "counts": counts,
            "waiting": waiting,
            # queued lanes missing from the queued index (evicted keys): `revive NAME` fixes one
            "unindexed_lanes": unindexed,
            "breakers": [asdict(state) for state in breakers],
            "beat": beat,
            "beat_root_conflict": conflict,
            "invalid": invalid,
            "lock_claims": claims,
            "fixed_since_dead": [lane for lane, _ in fixed],
            "dead_persona_gone": orphans,
            "retrying_persona_gone": retrying_gone,
            "unusable_names": unusable,
            "redis_data_lost": lost,
            # each turn kind no worker consumes: {queue, lanes queued over QUEUED_TOO_LONG}
            # null: the workers could not be asked (Redis refused the ping: full, failing over)
            "unserved_queues": None
            if unserved is None
            else {
                kind: {"queue": queue_name(state.settings.queue_prefix, kind), "lanes": n}
                for kind, n in unserved.items()
            },
            "redis_memory": {
                "used": used,
                "max": limit,
                "full": full,
                "policy": policy,
                "evicting": evicting,
                "evicted_keys": evicted,
            },
        }
        click.echo(json.dumps(payload, ensure_ascii=False))
        return
    if shown:
        click.echo(table([row(entry) for entry in shown]))
    else:
        click.echo(f"no personas {'in state ' + only + ' ' if only else ''}in {root}")
    if invalid:
        click.echo(f"invalid personas ({len(invalid)}, not scheduled until fixed):")
        for name, error in invalid.items():
            click.echo(f"  {name}: {' '.join(error.split())}")
    _echo_claims(claims)
    if unusable and only is None:
        click.echo(
            f"directories skipped ({len(unusable)}, not usable persona names: letters, digits, "
            f"'.', '_', '-', a letter or digit first; at most 64; no '..'; not ending in "
            f"-dreamer; rename them): "
            f"{', '.join(repr(name) for name in unusable)}"
        )
    _echo_gone(orphans, retrying_gone, only)
    click.echo(
        f"lanes: {counts['queued']} queued, {counts['running']} running, {counts['dead']} dead, "
        f"{waiting['retry']} retrying, {waiting['deferred']} deferred "
        f"| personas: {len(entries)} in {root}"
    )
    if unindexed:
        click.echo(
            f"lanes lost from their index ({len(unindexed)}: {', '.join(unindexed)}): queued, "
            "running, retrying or deferred, but not counted above and never taken on by any "
            "pass (re-sent, reaped, released or resumed), since Redis evicted or lost keys of "
            "theirs; `soulfleet revive --all` puts them back and sends their turns (or `soulfleet "
            "revive NAME`, --dreamer for NAME-dreamer)"
        )
    redis_lines = _redis_lines((used, limit, policy), lost, evicted)
    for line in [*breaker_lines(breakers, lost=_lost_deferred(entries, unindexed)), *redis_lines]:
        click.echo(line)
    click.echo(_beat_line(beat, state.settings.sweep_interval, redis_full=full))
    if conflict is not None:
        click.echo(root_conflict_line(conflict))
    _workers_line(state, unserved)
    _fixed_hint(fixed)
    for line in dead_causes(entries, {lane for lane, _ in fixed}):
        click.echo(line)


def _echo_gone(dead: Sequence[str], retrying: Sequence[str], only: str | None) -> None:
    """The lanes of personas whose directories are gone: not in the table, which lists the
    root's directories, so named here for the counts to add up."""
    if dead and only in (None, "dead"):
        click.echo(
            f"dead lanes of removed personas ({len(dead)}, their directories are gone; "
            f"never revived): {', '.join(dead)}"
        )
    if retrying and only in (None, "retry", "failing"):
        click.echo(
            f"retrying lanes of removed personas ({len(retrying)}, their directories are "
            "gone: retried while a move may be under way, dead-lettered after "
            f"{EDIT_GRACE_SECONDS:.0f}s of it): {', '.join(retrying)}"
        )


def _redis_lines(
    memory: tuple[int, int, str], lost: Mapping[str, Any] | None, evicted: int
) -> list[str]:
    """What ``status`` says of Redis itself (``memory``: used, maxmemory, policy): full, on
    an evicting policy, keys evicted, lost its data."""
    used, limit, policy = memory
    lines = []
    evicting = evicts(policy)
    if evicted:
        fix = (
            "`redis-cli CONFIG SET maxmemory-policy noeviction`"
            if evicting
            else "the policy is noeviction now, so nothing more is evicted"
        )
        lines.append(
            f"redis: {evicted:,} keys EVICTED since it started (maxmemory-policy {policy or '?'} "
            f"now): lane hashes, fences and inbox items may have been thrown away; {fix}; "
            'ops/runbook.md "Redis may evict keys" (the count stays until Redis restarts or '
            "`CONFIG RESETSTAT`)"
        )
    if 0 < limit <= used:
        lines.append(
            f"redis: FULL ({used:,} bytes used of its maxmemory {limit:,}): posts, ticks and turn "
            "commits are refused until it has room: `redis-cli CONFIG SET maxmemory <more>`, "
            'then ops/runbook.md "Redis memory near its limit"'
        )
    elif limit > 0 and used >= limit * MEMORY_HIGH:
        # Said before it is full: a large post is refused (OOM) while used is still below max,
        # and status said nothing until every write was.
        lines.append(
            f"redis: memory at {used / limit:.0%} of its maxmemory ({used:,} of {limit:,} "
            "bytes): large posts are refused first, then every write; give it room "
            '(`redis-cli CONFIG SET maxmemory <more>`) or find what grew: ops/runbook.md "Redis '
            'memory near its limit"'
        )
    if evicting:
        # beat only logs it (redis.evicting_policy) and LRU keeps used memory under maxmemory,
        # so nothing else here would say that the fleet's state is being thrown away.
        lines.append(
            f"redis: maxmemory-policy {policy}: Redis may silently evict lane hashes, fences, "
            "leases and inbox items (lost or doubled turns): `redis-cli CONFIG SET "
            'maxmemory-policy noeviction` now, and in its config; ops/runbook.md "Redis may '
            'evict keys"'
        )
    if lost is not None:
        # Under an evicting policy the marker itself may have been evicted: no restart needed.
        how = "a restart without its AOF, FLUSHALL" + (
            ", or eviction" if evicting or evicted else ""
        )
        lines.append(
            f"redis: lost its data {ago(lost.get('at'))} (beat found its marker gone: {how}): "
            "the schedule was rebuilt from the persona files, but inbox items, running turns "
            "and today's token counts of that moment are lost (daily budgets count from 0 "
            "again), and every conversation starts over (the old ones stay in transcripts/); "
            'ops/runbook.md "Redis down or restarted" (said for a day)'
        )
    return lines


def _mark_unindexed(entries: Sequence[Mapping[str, Any]], unindexed: Sequence[str]) -> None:
    """Mark each lane lost from its index in its own status entry (``unindexed``): its row
    must not promise the reaper, release or resume that cannot see it."""
    lost = set(unindexed)
    for entry in entries:
        for lane, lane_entry, _ in lanes_of(entry):
            if lane in lost and isinstance(lane_entry, dict):
                lane_entry["unindexed"] = True


def _lost_deferred(
    entries: Sequence[Mapping[str, Any]], unindexed: Sequence[str]
) -> dict[str, int]:
    """Per provider, how many of its deferred lanes are among ``unindexed``."""
    lost: dict[str, int] = {}
    for lane, state, provider in _indexed_lanes(entries):
        if state == "deferred" and lane in unindexed:
            lost[provider] = lost.get(provider, 0) + 1
    return lost


def _indexed_lanes(entries: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """``(lane, state, provider)`` of every lane (persona and dreamer) whose state is kept in
    an index: queued, running, retry, deferred."""
    return [
        (lane, str(lane_entry.get("state")), str(lane_entry.get("provider") or ""))
        for entry in entries
        for lane, lane_entry, _ in lanes_of(entry)
        if lane_entry.get("state") in ("queued", "running", "retry", "deferred")
    ]


def _unserved(state: CliContext, entries: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """Turn kinds whose queue no worker consumes, with their lanes queued too long; None when
    the workers could not be asked: the remote-control ping writes to Redis, which a full
    Redis refuses, and a full Redis is just when lanes pile up queued (no worker can take
    its messages). Everything else status shows is read, so it still answers."""
    publisher = state.publisher
    if publisher is None:
        return {}
    try:
        return unserved_kinds(entries, publisher.consumers_by_kind)
    except Exception as exc:
        if not any(is_redis_blip(cause) for cause in causes(exc, context=True)):
            raise
        return None


def _workers_line(state: CliContext, unserved: Mapping[str, int] | None) -> None:
    """Say so when lanes have waited in a queue no worker consumes (every worker gone)."""
    if unserved is None:
        click.echo(
            "workers: not asked (lanes have waited queued over "
            f"{QUEUED_TOO_LONG:.0f}s, but Redis refused the ping to the workers, which writes: "
            "see the redis line)"
        )
    elif unserved:
        waiting = ", ".join(
            f"{queue_name(state.settings.queue_prefix, kind)} ({n} lane(s) queued over "
            f"{QUEUED_TOO_LONG:.0f}s)"
            for kind, n in unserved.items()
        )
        click.echo(
            f"workers: NONE answered for {waiting}: their turns wait for a worker that is not "
            'coming; start workers (ops/runbook.md "Workers down or dying")'
        )


def _beat_line(
    beat: Mapping[str, Any] | None, sweep_interval: float, *, redis_full: bool = False
) -> str:
    if beat is None:
        return "beat: never swept (is `celery -A workers beat` running?)"
    line = f"beat: last sweep {ago(last_sweep_at(beat))}"
    if beat_stale(beat, sweep_interval):
        if redis_full:
            line += ": its sweeps are refused while Redis is full (see the redis line)"
        else:
            line += (
                f": STOPPED? it sweeps every {sweep_interval:g}s (SOULFLEET_SWEEP_INTERVAL); no "
                "heartbeat, dream or retry is queued meanwhile: check the beat process and its log"
            )
    return line


def _fixed_hint(fixed: Sequence[tuple[str, str]]) -> None:
    if fixed:
        lanes = ", ".join(lane for lane, _ in fixed)
        dreamer = any(lane.endswith(DREAMER_SUFFIX) for lane, _ in fixed)
        one = "PERSONA [--dreamer]" if dreamer else "PERSONA"
        click.echo(
            f"fixed since: {len(fixed)} dead-lettered lane(s) failed on their files or settings "
            f"(a configuration error, a persona directory gone), which are fine now ({lanes}): "
            f"`soulfleet revive --all` (or `soulfleet revive {one}`; --dreamer for a -dreamer "
            "lane) takes them back"
        )

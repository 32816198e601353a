"""What ``status`` and ``up`` say about a lane beyond its raw state.

- **Invalid personas.** beat's registry sync records each persona's last problem (``error`` in
  its ``Keys.registry`` record: a persona.toml that does not parse, a file it cannot read); a
  persona with one is shown ``invalid`` with that reason, since its turns can only fail.
- **The current error.** A lane keeps ``last_error`` after it recovers; it is only *current*
  while the lane is dead or failing, or when it is newer than the last finished turn. A revived
  lane that has since succeeded shows no error.
- **Fixed since.** A lane dead-lettered by a configuration error (invalid persona files, a
  model spec naming no model, settings) stays dead after the fix: nothing retries a dead lane.
  When its persona now passes the check-up, ``status`` and ``up`` say so and how to revive.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from workers.cli.errors import one_line
from workers.fleet import Fleet
from workers.fleet.scripts import redis_errors
from workers.persona.checkup import check_persona
from workers.persona.errors import SoulfleetError
from workers.persona.manifest import load_manifest
from workers.persona.mcp_servers import FleetServer
from workers.persona.models.config import ModelConfig
from workers.persona.python_tools import STALE_IMPORT
from workers.persona.schedules import ActiveHours
from workers.persona.spend import heartbeat_file_skip

__all__ = [
    "CONFIG_ERRORS",
    "DEAD_CAUSES_SHOWN",
    "TRANSIENT_DEAD_PREFIX",
    "current_error",
    "dead_causes",
    "display_state",
    "fixed_since",
    "heartbeat_unread",
    "invalid_personas",
    "lanes_of",
    "quiet_hours",
    "states_of",
]

#: Failure types a configuration fix cures (the turn records ``"<Type>: <message>"``).
CONFIG_ERRORS = (
    "PersonaConfigError",
    "PersonaFileError",
    "PersonaNotFound",
    "UnknownPersona",
    "ModelSpecError",
    "SettingsError",
    "CronError",
)


def invalid_personas(fleet: Fleet, names: Sequence[str] | None = None) -> dict[str, str]:
    """Persona -> why beat's registry sync refused it (unreadable, FIFO, bad TOML, overflowing
    duration...): read from the records the sync keeps, so status never opens a persona file."""
    with redis_errors(fleet.client):
        if names is None:
            raw = fleet.client.hgetall(fleet.keys.registry)
        else:
            values = fleet.client.hmget(fleet.keys.registry, list(names)) if names else []
            raw = {name: value for name, value in zip(names, values, strict=True) if value}
    invalid: dict[str, str] = {}
    for name, record in sorted(raw.items()):
        try:
            error = json.loads(record).get("error")
        except (ValueError, AttributeError):
            continue
        if error:
            invalid[str(name)] = str(error)
    return invalid


def current_error(lane: Mapping[str, Any]) -> str | None:
    """The lane's error while it still applies: the lane is dead, or its newest end was that
    failure (a failure records its time as the lane's last end too; a success after it ends
    later). A healthy running lane counts its attempt from the start, so attempts alone say
    nothing."""
    error = lane.get("last_error")
    if not error:
        return None
    if lane.get("state") == "dead":
        return str(error)
    failed_at, ended_at = lane.get("last_error_at"), lane.get("last_end")
    if failed_at is not None and (ended_at is None or float(failed_at) >= float(ended_at)):
        return str(error)
    return None


def display_state(entry: Mapping[str, Any]) -> str:
    """``invalid`` (files beat rejected), ``failing`` (queued or running again after an error
    that still applies), else the lane's own state (``retry`` waits out a backoff, also for a
    persona beat rejected: it counts towards a dead letter; ``deferred`` an open breaker)."""
    state = str(entry.get("state", "idle"))
    if entry.get("invalid") and state not in ("dead", "retry"):
        return "invalid"
    if state in ("idle", "queued", "running") and current_error(entry) is not None:
        return "failing"
    return state


def lanes_of(entry: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]]:
    """``(lane, its status entry, the revive flag naming it)`` for a persona's status entry:
    its own lane, and its dreamer's when it has one."""
    lanes: list[tuple[str, Mapping[str, Any], str]] = [
        (str(entry.get("lane") or entry.get("persona")), entry, "")
    ]
    dreamer = entry.get("dreamer")
    if isinstance(dreamer, Mapping) and dreamer.get("lane"):
        lanes.append((str(dreamer["lane"]), dreamer, " --dreamer"))
    return lanes


def states_of(entry: Mapping[str, Any]) -> set[str]:
    """Every state ``status --state`` matches this lane by (a lane waiting out a retry backoff
    is failing too; a dead lane of a persona beat records invalid is invalid too, as the
    `invalid personas` list under the table says)."""
    shown = display_state(entry)
    states = {shown, str(entry.get("state", "idle"))}
    if shown == "retry":
        states.add("failing")
    if entry.get("invalid"):
        states.add("invalid")
    return states


#: Tools errors that only a running MCP server can show (see :func:`fixed_since`): a name an
#: MCP tool shares (two Python tools sharing one, or one taking `memory`, the check-up sees).
#: An allow-list naming a tool the server lacks is no longer one (it leaves that tool out): a
#: lane dead-lettered for it before is fixed.
_SERVER_ONLY = re.compile(
    r"key 'tools\.[^']*\.name'|key 'tools\.mcp\[\d+\]' gives a tool|and so does tools\.mcp\["
)


def _config_error(error: str) -> bool:
    return any(name in error for name in CONFIG_ERRORS)


def fixed_since(
    fleet: Fleet,
    config: ModelConfig,
    *,
    mcp_servers: Mapping[str, FleetServer] | None,
    invalid: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """``(lane, error)`` for each dead lane killed by a configuration error whose persona now
    passes the check-up (reads only the dead lanes: there are few, whatever the fleet size).
    ``mcp_servers``: the MCP servers its workers know (None: unknown, a ``use`` is not
    checked).

    A persona beat still records as ``invalid`` is skipped without opening its files (one may
    be a FIFO): it is not fixed as far as the fleet knows.
    """
    with redis_errors(fleet.client):
        dead = [str(lane) for lane in fleet.client.zrange(fleet.keys.dead, 0, -1)]
    fixed: list[tuple[str, str]] = []
    for lane, status in zip(dead, fleet.lanes.status_many(dead), strict=True):
        error = str(status.get("last_error") or "")
        if not _config_error(error) or _SERVER_ONLY.search(error) or STALE_IMPORT in error:
            # Only a running server shows these (a tool name it makes too long, a name two
            # tools share): the check-up starts no servers, so it cannot say they are fixed.
            # Nor a worker's older import of a tool module: this fresh process imports the
            # module as it is now, and only restarting the workers fixes theirs.
            continue
        name, _role = fleet.registry.parse_lane(lane)
        if invalid is not None and name in invalid:
            continue
        try:
            check_persona(fleet.registry.home(name), config, mcp_servers=mcp_servers)
        except (SoulfleetError, ValueError, OSError):
            continue
        fixed.append((lane, error))
    return fixed


def heartbeat_unread(home: Path) -> str | None:
    """Why no heartbeat of the persona at ``home`` runs a turn: ``"no_heartbeat"`` (no
    schedule), or why every one is skipped for its HEARTBEAT.md
    (:func:`~workers.persona.spend.heartbeat_file_skip`); None when its heartbeats run, or when
    its persona.toml is invalid (the caller's check-up says that itself)."""
    try:
        if load_manifest(home).heartbeat is None:
            return "no_heartbeat"
    except (SoulfleetError, OSError):
        return None
    return heartbeat_file_skip(home)


def quiet_hours(home: Path, now: float) -> ActiveHours | None:
    """The persona's ``heartbeat.active_hours`` when ``now`` lies outside them (beat skips its
    ticks without a model call until the window opens); None inside them, without a window,
    or when its persona.toml is invalid (said elsewhere)."""
    try:
        schedule = load_manifest(home).heartbeat
    except (SoulfleetError, OSError):
        return None
    hours = schedule.active_hours if schedule is not None else None
    return None if hours is None or hours.contains(now) else hours


#: Dead-lettered lanes are grouped by the HTTP status their error names, else by the error's
#: class in parentheses (``model call failed (ModelAuthError)``), else by its first words.
_HTTP = re.compile(r"HTTP \d{3}")
_CLASS = re.compile(r"\(([A-Z][A-Za-z]+)\)")
#: What fail.lua puts before the last error of a lane that failed transiently for
#: SOULFLEET_RETRY_FOR (its seconds differ from lane to lane), and before a permanent one.
TRANSIENT_DEAD_PREFIX = r"transient failures for \d+s \(SOULFLEET_RETRY_FOR\), last: "
_PREFIX = re.compile(rf"^(permanent failure, not retried: |{TRANSIENT_DEAD_PREFIX})")
#: Causes named one by one at most; the rest are counted.
DEAD_CAUSES_SHOWN = 3


def dead_causes(entries: Sequence[Mapping[str, Any]], fixed: Collection[str]) -> list[str]:
    """Lines grouping the dead-lettered lanes by cause, each with the one command that takes
    that group back once fixed: after a fleet-wide incident (a revoked key dead-letters every
    lane that ran within one heartbeat) the table showed each lane's error cut at 60
    characters and the summary only "100 dead", while `revive --reason` is what takes them
    back. Lanes the fixed-since line names are left to it."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for entry in entries:
        for lane, lane_entry, _ in lanes_of(entry):
            if lane_entry.get("state") != "dead" or lane in fixed:
                continue
            raw = str(lane_entry.get("last_error") or "unknown error")
            http, named = _HTTP.search(raw), _CLASS.search(raw)
            if http is not None:
                cause = http.group(0)
            elif named is not None:
                cause = named.group(1)
            else:
                # The words of the error itself, as `revive --reason` matches them: not the
                # dead letter's own prefix (a transient one counts its seconds per lane).
                body = _PREFIX.sub("", raw).strip()
                cause = (body.splitlines() or ["unknown error"])[0][:40].strip()
            groups.setdefault(cause, []).append((lane, " ".join(raw.split())))
    if sum(len(lanes) for lanes in groups.values()) < 2:
        return []  # one dead lane: its row and `status NAME` say it all
    ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    lines = []
    for cause, lanes in ranked[:DEAD_CAUSES_SHOWN]:
        first, error = lanes[0]
        example = one_line(error, 160)
        lines.append(
            f"dead: {len(lanes)} lane(s) on {cause} (e.g. {first}: {example}); fix the cause, "
            f"then `soulfleet revive --reason {shlex.quote(cause)}` takes back every dead lane "
            "whose error says so (kept items run first)"
        )
    rest = sum(len(lanes) for _, lanes in ranked[DEAD_CAUSES_SHOWN:])
    if rest:
        lines.append(f"dead: {rest} more lane(s) on other causes (`soulfleet status --state dead`)")
    return lines

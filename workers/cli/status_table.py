"""The status table: one row per persona lane, as ``soulfleet status`` prints it.

What each row says of a lane beyond its Redis state (:func:`annotate`: beat's reason for an
invalid persona, the current error, a lease its worker stopped renewing) and how it is drawn
(:func:`row`, :func:`table`). :mod:`workers.cli.status` runs the command and prints the
fleet-wide lines under the table.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from workers.cli.health import current_error, display_state

__all__ = ["ago", "annotate", "row", "table", "until"]

_COLOURS = {"dead": "red", "failing": "yellow", "retry": "yellow", "invalid": "yellow"}

_COLUMNS = (
    "PERSONA", "STATE", "TICKS", "INBOX", "TRIES", "TOKENS TODAY", "LAST TURN", "DREAMER",
    "LAST ERROR",
)  # fmt: skip


def ago(when: object, now: float | None = None) -> str:
    """``"12s ago"`` for an epoch time, ``"-"`` for none."""
    if not isinstance(when, (int, float)) or when <= 0:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - float(when))
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h ago"
    return f"{seconds / 86400:.0f}d ago"


def until(when: float | None, now: float) -> str:
    """``"in 12s"`` until an epoch time, ``"due"`` once it passed, ``"-"`` for none."""
    if when is None:
        return "-"
    seconds = when - now
    return "due" if seconds <= 0 else f"in {seconds:.0f}s"


def annotate(
    entry: dict[str, Any], invalid: Mapping[str, str], root: Path, lease_ttl: float
) -> dict[str, Any]:
    """Add ``invalid`` (beat's reason), ``error`` (the current one), ``note`` (without an
    error, how the newest turn ended short: ``last_note``) and ``display_state``."""
    reason = invalid.get(str(entry.get("persona")))
    entry.setdefault("home", str(root / str(entry.get("persona"))))
    if reason:
        entry["invalid"] = reason
    # A lane waiting out its retry has its own error to show, counting towards a dead letter
    # (a persona caught mid-edit: PersonaEditing): beat's reason would hide it.
    lane_error = current_error(entry) if entry.get("state") == "retry" else None
    entry["error"] = lane_error or reason or current_error(entry)
    # No error, but the newest turn ended short for a reason that repeats (a soul over the
    # token budget ends every turn without a model call): shown where an error would be.
    entry["note"] = None if entry["error"] else entry.get("last_note")
    entry["display_state"] = display_state(entry)
    entry["lease_silent"] = _lease_silent(entry, lease_ttl)
    dreamer = entry.get("dreamer")
    if isinstance(dreamer, dict):
        dreamer["error"] = current_error(dreamer)
        dreamer["display_state"] = display_state(dreamer)
        dreamer["lease_silent"] = _lease_silent(dreamer, lease_ttl)
        dreamer["note"] = None if dreamer["error"] else dreamer.get("last_note")
        if entry["error"] is None and dreamer["error"]:
            entry["error"] = f"dreamer: {dreamer['error']}"
        elif entry["error"] is None and entry["note"] is None and dreamer["note"]:
            # A dream pass that ends short every night (its DREAM.md over the token budget)
            # showed nothing anywhere in the table.
            entry["note"] = f"dreamer: {dreamer['note']}"
    return entry


def _lease_silent(entry: Mapping[str, Any], lease_ttl: float) -> float | None:
    """Seconds since a running turn's lease was last renewed, once that is over half the TTL
    (a live worker renews every third of it): its worker has probably died, and beat's reaper
    takes the lane back when the lease lapses. None while it is renewed, or not running."""
    left = entry.get("lease_left")
    if entry.get("state") != "running":
        return None
    if not isinstance(left, int | float):
        # Running without a lease: it lapsed (or a Redis restart lost it) and the reaper's
        # next pass takes the lane back. Silent for the whole TTL at least.
        return round(lease_ttl)
    silent = lease_ttl - float(left)
    return round(silent) if silent > lease_ttl / 2 else None


def row(entry: Mapping[str, Any], *, whole_error: bool = False) -> tuple[str, ...]:
    """One table row; ``whole_error`` keeps the error uncut (a table of one persona)."""
    last = "-"
    if entry.get("last_turn"):
        last = f"{entry.get('last_status') or '?'} {ago(entry.get('last_end'))}"
    dreamer_state = _dreamer_state(entry.get("dreamer"))
    error = " ".join(str(entry.get("error") or entry.get("note") or "-").split())
    home = entry.get("home")
    if home:  # the table is about this persona already: its path only costs width
        error = error.replace(f"{home}{os.sep}", "")
    state = str(entry.get("display_state") or entry.get("state", "idle"))
    if state == "retry":
        retry_at = entry.get("retry_at")
        state = f"retry {until(retry_at if isinstance(retry_at, float) else None, time.time())}"
    elif state == "deferred":
        state = f"deferred ({entry.get('provider') or '?'})"
    elif entry.get("state") == "queued":
        # A lane whose turn message was lost waits for the reaper (SOULFLEET_REAP_QUEUED_AFTER)
        # and read just like one about to run. A failing one says which it is timed by
        # ("failing for 11s" counted from a requeue, not from the first failure).
        state = _timed(state, "queued", lasted(entry.get("queued_at")))
    elif entry.get("state") == "running":
        # A turn held by a hanging provider looked like any other for its whole timeout.
        state = _timed(state, "running", lasted(entry.get("started_at")))
        silent, left = entry.get("lease_silent"), entry.get("lease_left")
        if silent is not None and isinstance(left, int | float):
            # A killed worker's turn looked alive until its lease lapsed (30 s by default).
            state += f" (lease not renewed for {silent:.0f}s, lapses in {left:.0f}s)"
        elif silent is not None and not entry.get("unindexed"):
            state += " (lease lapsed: beat's reaper takes the lane back at its next pass)"
    if entry.get("unindexed"):  # no pass sees it: only a revive puts it back
        state += " (LOST from its index: `soulfleet revive` puts it back)"
    tokens = str(entry.get("tokens_today", 0))
    if entry.get("daily_tokens") is not None:
        tokens += f"/{entry['daily_tokens']}"
    return (
        str(entry.get("persona", "")),
        state,
        str(entry.get("pending_ticks", 0)),
        _inbox(entry),
        str(entry.get("attempts", 0)),
        tokens,
        last,
        dreamer_state,
        error if whole_error or len(error) <= 60 else error[:57] + "...",
    )


def _dreamer_state(dreamer: object) -> str:
    """The DREAMER column: its state, with how long a running or queued pass has been so."""
    if not isinstance(dreamer, Mapping):
        return "-"
    shown = dreamer.get("display_state") or dreamer.get("state", "idle")
    # A running or queued pass with how long it has been so, not the previous pass's end
    # ("running 68s ago" read as running for 68 s while the pass had just begun).
    raw = str(dreamer.get("state"))
    since = {"running": "started_at", "queued": "queued_at"}.get(raw)
    if since:
        state = _timed(str(shown), raw, lasted(dreamer.get(since)))
    else:
        state = f"{shown} {ago(dreamer.get('last_end'))}".strip()
    if dreamer.get("unindexed"):
        state += " (LOST from its index: revive --dreamer)"
    return state


def _timed(shown: str, state: str, when: str) -> str:
    """A queued or running lane's STATE: ``queued for 11s``, or ``failing (queued for 11s)``
    (the time is the queue's or the run's, not the failure's; the first word stays the state
    the colours and filters know)."""
    timed = f"{state} {when}".strip()
    return f"{shown} ({timed})" if shown != state else timed


def _inbox(entry: Mapping[str, Any]) -> str:
    """Items waiting, ``+N`` for those a turn holds: running it, or kept for its retry (a
    deferred or retrying lane's post showed as an empty inbox, which read as a lost post)."""
    held = entry.get("inflight_items") or 0
    waiting = str(entry.get("inbox_depth", 0))
    return f"{waiting}+{held}" if isinstance(held, int) and held > 0 else waiting


def lasted(since: object) -> str:
    """``"for 80s"`` since an epoch time, ``""`` for none."""
    if not isinstance(since, (int, float)) or since <= 0:
        return ""
    return "for " + ago(since).removesuffix(" ago")


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in (_COLUMNS, *rows)) for i in range(len(_COLUMNS))]
    lines = []
    for row in (_COLUMNS, *rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        colour = _COLOURS.get(row[1].split(" ", 1)[0])
        if colour is not None:  # click.echo drops the escapes when stdout is not a terminal
            cells[1] = click.style(cells[1], fg=colour)
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)

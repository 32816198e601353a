"""``soulfleet session show|reset PERSONA``: look at, or end, a persona's conversation.

A persona lane keeps one session at a time: the soul frozen when it started and the
conversation since (README "Sessions"). ``show`` prints what the fleet holds for it (never the
soul or the messages themselves: those are in ``<persona>/sessions/`` and
``<persona>/transcripts/``); ``reset`` ends it, so the next turn composes a fresh soul (picking
up MEMORY.md and SOUL.md edits) and starts without history.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from workers.cli.errors import one_line
from workers.cli.group import cli_context, personas_option

__all__ = ["edited_note", "session"]

_ENDS = {
    "idle": "ended by idle_reset: the next turn starts a new session",
    "daily": "ended by daily_reset: the next turn starts a new session",
    # A silent heartbeat runs on a fresh soul but keeps nothing, so the reset stays pending.
    "reset": "reset: the next turn that is not a silent heartbeat starts a new session",
}


def _when(stamp: object) -> str:
    if not isinstance(stamp, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def _lines(report: dict[str, Any]) -> list[str]:
    if report["id"] is None:
        return [f"{report['persona']}: no session yet (the next turn starts one)"]
    ends = report.get("ends")
    return [
        f"{report['persona']}: session {report['id']}",
        f"  status:        {_ENDS.get(str(ends), 'active') if ends else 'active'}",
        f"  started:       {_when(report['started_at'])}",
        f"  last turn:     {_when(report['last_turn_at'])}",
        f"  turns:         {report['turns']}",
        f"  messages:      {report['messages']}",
        f"  est. tokens:   {report['estimated_tokens']}",
        f"  compactions:   {report['compactions']}",
        *(f"  compaction:    {line}" for line in [_failed_line(report)] if line),
        f"  soul:          {report.get('soul_bytes', 0)} bytes, frozen at session start",
        *(f"  edited:        {note}" for note in [edited_note(report)] if note),
    ]


def _failed_line(report: dict[str, Any]) -> str | None:
    failed = report.get("compaction_failed")
    if not isinstance(failed, dict):
        return None
    error = one_line(str(failed.get("error") or "?"), 300)
    todo = (
        # The summary call was cut at half of what the turn had left of its time.
        "give turns more time (SOULFLEET_TURN_MAX_SECONDS) or the session a smaller "
        "session.max_tokens"
        if error.startswith("TurnTimeUp")
        else "check the model's answers to the summary prompt"
    )
    return (
        f"FAILING since {_when(failed.get('at'))}: {error}; the history is kept whole (the "
        f"session grows past session.max_tokens) and each turn over it tries again: {todo} "
        "(`soulfleet session reset` starts over)"
    )


def edited_note(report: dict[str, Any]) -> str | None:
    """What the session goes on without: the files people edited since it began."""
    edited = report.get("edited") or []
    if not edited:
        return None
    them, it = ("them", "they were") if len(edited) > 1 else ("it", "it was")
    return (
        f"{', '.join(edited)} changed after this session froze its soul; it goes on with {them} "
        f"as {it} until it ends (idle or daily reset): `soulfleet session reset "
        f"{report['persona']}` makes the next turn read {them}"
    )


@click.group()
def session() -> None:
    """Show or reset a persona's session (its remembered conversation)."""


@session.command()
@click.argument("persona")
@click.option("--json", "as_json", is_flag=True, help="Print the session summary as JSON.")
@personas_option
@click.pass_context
def show(ctx: click.Context, *, persona: str, as_json: bool, personas: Path | None) -> None:
    """Show PERSONA's current session: id, turns, messages, estimated tokens, compactions."""
    state = cli_context(ctx, personas)
    report = state.fleet().session(state.persona(persona))
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False))
        return
    for line in _lines(report):
        click.echo(line)


@session.command()
@click.argument("persona")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@personas_option
@click.pass_context
def reset(ctx: click.Context, *, persona: str, as_json: bool, personas: Path | None) -> None:
    """End PERSONA's session: its next turn starts a new one with a freshly composed soul."""
    state = cli_context(ctx, personas)
    name = state.persona(persona)
    epoch = state.fleet().reset_session(name)
    if as_json:
        click.echo(json.dumps({"persona": name, "reset": True, "epoch": epoch}))
        return
    click.echo(f"reset {name}: its next turn starts a new session")

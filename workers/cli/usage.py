"""``soulfleet usage [NAME] [--top N] [--days N] [--json]``: who spent which tokens on what.

Numbers are the model providers' own (input, output, cached input), counted per answered call
in Redis (:mod:`workers.fleet.usage`), so they are what the bill says. Without NAME: every
persona that used a model, biggest spender first (``--top N`` keeps the first N per day);
with NAME: that persona's days, with a line per model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from workers.cli.context import CliContext
from workers.cli.group import cli_context, personas_option
from workers.fleet.errors import UnknownPersona, UnusablePersonaName
from workers.fleet.registry import valid_persona_name

__all__ = ["usage"]

_COLUMNS = ("DAY", "PERSONA", "TOKENS", "INPUT", "CACHED", "OUTPUT", "CALLS", "MODEL")


def _rows(entries: Sequence[Mapping[str, Any]], *, per_model: bool) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for entry in entries:
        models: Mapping[str, Mapping[str, int]] = entry.get("models") or {}
        shown = "all" if len(models) != 1 else next(iter(models))
        rows.append(_line(entry, entry, shown))
        if per_model and len(models) > 1:
            rows += [_line(entry, numbers, name) for name, numbers in models.items()]
    return rows


def _line(entry: Mapping[str, Any], numbers: Mapping[str, Any], model: str) -> tuple[str, ...]:
    return (
        str(entry["day"]),
        str(entry["persona"]),
        str(numbers.get("tokens", 0)),
        str(numbers.get("input", 0)),
        str(numbers.get("cached", 0)),
        str(numbers.get("output", 0)),
        str(numbers.get("calls", 0)),
        model,
    )


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in (_COLUMNS, *rows)) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (_COLUMNS, *rows)
    )


@click.command()
@click.argument("name", required=False)
@click.option("--top", type=click.IntRange(min=1), help="Only the N biggest spenders per day.")
@click.option("--days", type=click.IntRange(min=1), default=1, show_default=True,
              help="Days to show, today included.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@personas_option
@click.pass_context
def usage(
    ctx: click.Context,
    *,
    name: str | None,
    top: int | None,
    days: int,
    as_json: bool,
    personas: Path | None,
) -> None:
    """Tokens and model calls per persona per day (NAME: one persona, per model)."""
    state = cli_context(ctx, personas)
    persona, entries = (
        _persona(state, name, days) if name is not None else (None, state.fleet().usage(days=days))
    )
    if persona is None and top is not None:
        per_day: dict[str, int] = {}
        kept = []
        for entry in entries:  # newest day first, biggest spender first within a day
            per_day[entry["day"]] = per_day.get(entry["day"], 0) + 1
            if per_day[entry["day"]] <= top:
                kept.append(entry)
        entries = kept
    if as_json:
        click.echo(json.dumps({"usage": entries}, ensure_ascii=False))
        return
    if not entries:
        click.echo("no model calls counted in that time")
        return
    click.echo(_table(_rows(entries, per_model=persona is not None)))
    total = sum(int(entry["tokens"]) for entry in entries)
    click.echo(f"total: {total} tokens in {sum(int(e['calls']) for e in entries)} model calls")


def _persona(state: CliContext, name: str, days: int) -> tuple[str, list[dict[str, Any]]]:
    """The fleet's name for ``name`` and its usage; a removed persona's too while its spend is
    on record (the fleet-wide table lists it, and its spend was refused by model)."""
    try:
        persona = state.persona(name)
    except UnusablePersonaName:
        raise
    except UnknownPersona:
        entries = state.fleet().usage(name, days=days) if valid_persona_name(name) else []
        if not any(int(entry["calls"]) or int(entry["tokens"]) for entry in entries):
            raise
        click.echo(
            f"soulfleet: note: {name} has no directory under {state.settings.personas} "
            "(removed or renamed?): its recorded usage",
            err=True,
        )
        return name, entries
    return persona, state.fleet().usage(persona, days=days)

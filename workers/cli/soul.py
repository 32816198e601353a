"""``soulfleet soul DIR [--json]``: preview exactly what a turn of this persona would read.

The soul is composed by :func:`workers.persona.home.compose_soul` with the persona's own
persona.toml settings (``memory_index_cap``, ``notes``), the same call a turn makes, so the
preview is byte-for-byte the system prompt. The soul goes to stdout alone (pipe it, diff it);
the found list goes to stderr. ``--json`` prints ``{"soul": ..., "found": [...]}``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from workers.cli.context import persona_dir
from workers.cli.group import cli_context, personas_option
from workers.persona.checkup import check_persona

__all__ = ["soul"]


@click.command()
@click.argument("directory")
@click.option("--json", "as_json", is_flag=True, help='Print {"soul": ..., "found": [...]}.')
@personas_option
@click.pass_context
def soul(ctx: click.Context, directory: str, as_json: bool, personas: Path | None) -> None:
    """Show the soul composed from DIRECTORY (a path, or a persona name under the root)."""
    settings = cli_context(ctx, personas).settings
    # A bare name is the fleet's persona first, as `run`, `status` and `session` read it (a
    # directory of that name here showed another persona's soul, with no word of it).
    path = persona_dir(directory, settings.personas)
    here = Path(directory).expanduser()
    if path != here and here.is_dir() and here.resolve() != path.resolve():
        click.echo(
            f"soulfleet: note: showing persona {directory} of {settings.personas}; the directory "
            f"{directory} here is another (pass ./{directory} to preview that one)",
            err=True,
        )
    # Refuses what a turn would fail with (a model spec or rules file that cannot load, a
    # Python tool that does not import, a `use` the fleet lacks: the running `up`'s, wherever
    # the directory is), as `post` does; warns on an
    # empty soul (`soulfleet soul /etc`), a soul over the turn budget, a key this shell lacks.
    as_workers, mcp_servers = cli_context(ctx).as_workers_see(path, anywhere=True)
    with as_workers:
        checkup = check_persona(
            path,
            settings.model,
            turn_max_tokens=settings.turn_max_tokens,
            mcp_servers=mcp_servers,
        )
    for warning in checkup.warnings:
        click.echo(f"soulfleet: warning: {warning}", err=True)
    text, found = checkup.soul, checkup.found
    if as_json:
        click.echo(json.dumps({"soul": text, "found": found}, ensure_ascii=False))
        return
    size = len(text.encode("utf-8"))
    click.echo(f"found: {', '.join(found) or '(no bootstrap files)'} ({size} bytes)", err=True)
    click.echo(text)

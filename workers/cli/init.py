"""``soulfleet init DIR``: scaffold a persona home that explains itself.

Every bootstrap file starts with a short comment on its role, persona.toml comments every key,
and DREAM.md steers the dreamer, so a new user learns the persona layout by opening the files.
The templates are package data (``workers/cli/scaffold/``), read-only.

It never overwrites: if any file it would write already exists, it writes NOTHING and names the
files, because a persona home is someone's work.
"""

from __future__ import annotations

import json
import os
import shlex
from importlib import resources
from pathlib import Path

import click

from workers.cli.context import fleet_environ
from workers.cli.errors import BadInputError
from workers.fleet.errors import UnusablePersonaName
from workers.fleet.registry import valid_persona_name
from workers.persona.home import BOOTSTRAP_ORDER
from workers.persona.manifest import MANIFEST_NAME, holds_persona

__all__ = ["SCAFFOLD_FILES", "init", "scaffold"]

SCAFFOLD_FILES: tuple[str, ...] = (*BOOTSTRAP_ORDER, MANIFEST_NAME, "DREAM.md")


def scaffold(directory: Path) -> list[Path]:
    """Write every scaffold file into ``directory`` (created if needed); return the paths.

    Raises :class:`BadInputError` naming the files that exist, before writing anything.
    """
    if directory.exists() and not directory.is_dir():
        raise BadInputError(f"{directory} exists and is not a directory")
    # lexists: a dangling symlink at a name counts (writing would fail half-way through)
    existing = [name for name in SCAFFOLD_FILES if os.path.lexists(directory / name)]
    if existing:
        raise BadInputError(
            f"refusing to overwrite existing files in {directory}: {', '.join(existing)} "
            "(init only creates a new persona home; move them away or pick another directory)"
        )
    name = directory.resolve().name
    templates = resources.files("workers.cli").joinpath("scaffold")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (NotADirectoryError, FileExistsError):  # a file where a parent should be
        blocker = next((p for p in directory.parents if p.exists() and not p.is_dir()), None)
        raise BadInputError(
            f"cannot create {directory}: {blocker or 'a path above it'} is a file, not a "
            "directory; pick a directory path"
        ) from None
    written: list[Path] = []
    for filename in SCAFFOLD_FILES:
        text = templates.joinpath(filename).read_text(encoding="utf-8")
        target = directory / filename
        # "x": fail rather than clobber a file that appeared since the check above.
        with target.open("x", encoding="utf-8") as handle:
            handle.write(text.replace("{{name}}", name))
        written.append(target)
    return written


def _fleet_root() -> Path | None:
    """The personas root this shell's fleet serves: SOULFLEET_PERSONAS, else a running `up`'s
    (None when neither says: ./personas is only a default)."""
    env, _ = fleet_environ(None)
    given = (env.get("SOULFLEET_PERSONAS") or "").strip()
    return Path(given).expanduser().resolve() if given else None


def _refuse_misplaced(directory: Path, root: Path | None) -> None:
    """Refuse a persona home that would sit on a personas root or inside another persona:
    the fleet would take its sessions/ and transcripts/ for personas of their own, and write
    one persona's state into another's."""
    home = directory.resolve()  # as scaffold() writes it (a quoted "~" is a directory name)
    if home == root:
        raise BadInputError(
            f"{directory} is the personas root the fleet serves: a persona is one directory "
            f"in it, such as {shlex.quote(str(directory / 'ava'))}"
        )
    if home.is_dir():
        try:
            holds = sorted(c.name for c in home.iterdir() if c.is_dir() and holds_persona(c))
        except OSError:
            holds = []
        if holds:
            shown = ", ".join(holds[:5]) + (", ..." if len(holds) > 5 else "")
            raise BadInputError(
                f"{directory} holds personas ({shown}): it is a personas root, not a persona; "
                f"a new persona is one directory in it, such as "
                f"{shlex.quote(str(directory / 'NAME'))}"
            )
    owner = next((p for p in home.parents if holds_persona(p)), None)
    if owner is not None:
        raise BadInputError(
            f"{directory} is inside the persona {owner} (it holds {MANIFEST_NAME} or SOUL.md): "
            "a persona inside another would mix their files; pick a directory beside it, such "
            f"as {shlex.quote(str(owner.parent / home.name))}"
        )


@click.command()
@click.argument("given", metavar="DIRECTORY")
@click.option("--json", "as_json", is_flag=True, help="Print what was created as JSON.")
def init(given: str, as_json: bool) -> None:
    """Scaffold a persona home in DIRECTORY (bootstrap files, persona.toml, DREAM.md)."""
    if not given.strip():  # Path("") is the current directory: `init "$UNSET"` filled it
        raise BadInputError(
            "DIRECTORY is empty (an unset shell variable?): name the persona's new directory, "
            "such as personas/ava"
        )
    directory = Path(given)
    root = _fleet_root()
    _refuse_misplaced(directory, root)
    written = scaffold(directory)
    if as_json:
        click.echo(json.dumps({
            "persona": directory.resolve().name, "directory": str(directory),
            "files": [path.name for path in written],
            "fleet_name": valid_persona_name(directory.resolve().name),
        }))  # fmt: skip
        return
    click.echo(f"created persona {directory.resolve().name!r} in {directory}:")
    for path in written:
        click.echo(f"  {path.name}")
    home = directory.resolve()
    if not valid_persona_name(home.name):
        unusable = UnusablePersonaName(home.name, home.parent)
        click.echo(f"note: {unusable}; `soulfleet run --local` works with it as it is", err=True)
    if root is not None and home.parent != root:
        click.echo(
            f"note: {home} is not under the personas root {root} the fleet serves, so the fleet "
            "does not schedule it; `soulfleet run --local` works with it where it is",
            err=True,
        )
    click.echo(
        f"next: soulfleet soul {shlex.quote(str(directory))}   (preview what the model will read)"
    )

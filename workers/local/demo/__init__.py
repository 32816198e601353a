"""The demo fleet ``soulfleet up`` runs when no personas are configured.

Three persona homes ship as package data under ``workers/local/demo/personas/`` and together show
everything a fleet does within its first minute, on the built-in scripted model (no key, no
network):

- ``ava`` beats every 20 s and her HEARTBEAT.md has a ``due:`` line, so each beat SURFACES a
  reminder (the beats feed, the terminal);
- ``milo`` beats every 10 s with nothing due, so his beats stay SILENT (``HEARTBEAT_OK``) and
  are only counted;
- ``nora`` has no heartbeat; ``up`` posts her a ``remember: ...`` welcome through the host API
  (:meth:`workers.fleet.Fleet.post`), which she writes to MEMORY.md, and her dreamer runs every
  20 s and logs each pass to ``memory/log.md``.

Why copy instead of running from the package: personas are edited by people and written by the
fleet (memory, transcripts), and an installed package must never be written to. The demo is
copied into the data directory ONCE, when its personas directory does not exist yet; later runs
use whatever the user made of it.
"""

from __future__ import annotations

import shutil
import time
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = ["DEMO_PERSONAS", "WELCOME_PERSONA", "demo_source", "install_demo", "welcome_text"]

DEMO_PERSONAS: tuple[str, ...] = ("ava", "milo", "nora")
#: The persona `up` sends its "remember: ..." welcome to: she has no heartbeat, so the welcome
#: always runs as a turn of its own (a heartbeat in the same turn would answer first).
WELCOME_PERSONA = "nora"


def demo_source() -> Traversable:
    """The packaged demo personas (read-only: an installed package is never written to)."""
    return resources.files(__name__).joinpath("personas")


def _copy_tree(source: Traversable, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        # Bytecode caches and packaging leftovers are not part of a persona.
        if entry.name.startswith((".", "__")) or entry.name.endswith((".py", ".pyc")):
            continue
        target = dest / entry.name
        if entry.is_dir():
            _copy_tree(entry, target)
        else:
            target.write_bytes(entry.read_bytes())


def install_demo(dest: Path) -> list[str]:
    """Copy the demo personas into ``dest`` if it does not exist yet; return what was copied.

    An existing ``dest`` is the user's (a previous run's copy, maybe edited): it is left
    exactly as it is and nothing is returned. The copy goes through a temporary sibling
    directory renamed into place, so an interrupted first run never leaves half a demo that
    a later run would mistake for the user's.
    """
    if dest.exists():
        return []
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".{dest.name}.installing")
    if staging.exists():
        shutil.rmtree(staging)
    source = demo_source()
    installed: list[str] = []
    for name in DEMO_PERSONAS:
        _copy_tree(source.joinpath(name), staging / name)
        installed.append(name)
    staging.rename(dest)
    return installed


def welcome_text(now: float | None = None) -> str:
    """The welcome item `up` posts to :data:`WELCOME_PERSONA` (a real inbox item)."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() if now is None else now))
    return f"remember: soulfleet up started this fleet at {stamp}"

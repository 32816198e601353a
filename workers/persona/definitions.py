"""The per-process cache of parsed persona definitions (home + persona.toml), by file identity.

Why: the fleet builds a persona's definition (:func:`workers.persona.agent.from_dir`) at the
start of EVERY turn, so that an edited persona.toml is obeyed by the next turn; resolving the
home and reading and parsing the TOML each time was a steady share of a turn's CPU while the
file almost never changes. Here the parsed result is kept per path and reused while two
``stat`` calls say nothing it was built from has changed:

* the home directory (``st_dev``, ``st_ino``): the same path now naming another directory (a
  re-pointed symlink, a directory moved into its place) is a miss;
* ``persona.toml`` (``st_ino``, ``st_size``, ``st_mtime_ns``, ``st_ctime_ns``), or its absence:
  an editor's save by rename is a new inode, an in-place edit moves the size or the times, and
  the change time cannot be set back by ``touch``/``utime``, so restoring the old mtime after a
  same-size edit is seen too.

The limit: file times have the kernel's timestamp granularity (a clock tick, 1-10 ms on Linux;
coarser on some network filesystems), so an in-place rewrite to the SAME size within the same
tick as the version we parsed is not seen until the file changes again. That takes two writes
of a persona.toml a few milliseconds apart, the second of the same length: a person's editor
does not do that, and any later edit (or ``touch persona.toml``) makes the cache re-read it.

Only successes are cached: an invalid persona.toml is read and refused on every call, so its
error stays exact. The cache is bounded (:data:`DEFINITIONS_MAX` paths, least recently used
dropped first) and thread-safe (one lock around the dict; the reading and parsing happen
outside it, and two threads that miss at once both parse, the later store winning).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

from workers.persona.home import persona_home
from workers.persona.manifest import MANIFEST_NAME, PersonaConfig, load_manifest

__all__ = ["DEFINITIONS_MAX", "Definitions", "definitions"]

#: How many persona paths one process keeps parsed definitions for.
DEFINITIONS_MAX = 4096

_Version = tuple[int, int, tuple[int, int, int, int] | None]


def _version(directory: str) -> _Version | None:
    """What the cached definition of ``directory`` depends on; None: do not use the cache."""
    try:
        home = os.stat(directory)
    except (OSError, ValueError):
        return None
    try:
        manifest = os.stat(os.path.join(directory, MANIFEST_NAME))
    except FileNotFoundError:
        return (home.st_dev, home.st_ino, None)
    except (OSError, ValueError):
        return None
    return (
        home.st_dev,
        home.st_ino,
        (manifest.st_ino, manifest.st_size, manifest.st_mtime_ns, manifest.st_ctime_ns),
    )


class Definitions:
    """Parsed ``(home, persona.toml)`` per persona path, valid while the files are unchanged."""

    def __init__(self, max_entries: int = DEFINITIONS_MAX) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[_Version, Path, PersonaConfig]] = OrderedDict()

    def load(self, path: str | os.PathLike[str]) -> tuple[Path, PersonaConfig]:
        """The resolved home and its parsed persona.toml (raises as ``persona_home`` and
        ``load_manifest`` do)."""
        key = os.path.expanduser(os.fspath(path))
        # Taken BEFORE reading: an edit landing while we parse leaves a version that no longer
        # matches, so the next call parses again rather than keeping what we read too early.
        version = _version(key)
        if version is not None:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry[0] == version:
                    self._entries.move_to_end(key)
                    return entry[1], entry[2]
        home = persona_home(key)
        config = load_manifest(home)
        if version is not None:
            with self._lock:
                self._entries[key] = (version, home, config)
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return home, config

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


#: The process's cache, used by :func:`workers.persona.agent.from_dir`.
definitions = Definitions()

"""The dream log (``note:log``, ``memory/log.md``): kept short, its older entries archived.

Every dream pass begins by reading the whole log (the dream prompt's first step) and ends by
adding a line to it, so a log that only grows makes every pass dearer: after a year of hourly
passes it is ~5 MiB of tokens, past every model's context, and at the 2 MiB file cap the
pass's own line is refused. Only the newest entries say where the last pass stopped.

So a write that takes ``memory/log.md`` past :data:`ROTATE_AT` bytes moves its oldest lines,
whole, to ``memory/archive/log.md`` (appended and fsynced first), and the log keeps the
newest :data:`KEEP` bytes or less. Nothing is dropped: the archive is on disk for people, out
of the model's reach (it is not a note: notes are ``memory/<slug>.md``). It runs inside the
memory write's lock (:mod:`workers.persona.memory_commit`), so it is one more step of the same
durable replace. A crash between the archive's append and the log's replace leaves those lines
in both; the next rotation appends them to the archive once more (a duplicate, never a loss).
"""

from __future__ import annotations

import os

import structlog

from workers.persona.errors import PersonaError
from workers.persona.files import confined, make_dirs
from workers.persona.writes import fsync_directory, open_regular, write_synced

__all__ = ["ARCHIVE", "KEEP", "LOG", "ROTATE_AT", "rotate"]

#: The dream log, relative to the persona directory.
LOG = "memory/log.md"
#: Where its older entries go.
ARCHIVE = "memory/archive/log.md"
#: A log write that would leave the log larger than this archives its oldest lines...
ROTATE_AT = 32 * 1024
#: ...until at most this many bytes (whole lines, the newest) are left.
KEEP = 16 * 1024

_log = structlog.get_logger("soulfleet.memory")


def rotate(root: str | os.PathLike[str], relative: str, new: bytes) -> bytes:
    """The bytes to write to ``relative`` instead of ``new``: ``new`` itself unless it is the
    dream log past :data:`ROTATE_AT`, else its newest lines, once the rest is in the archive."""
    if relative != LOG or len(new) <= ROTATE_AT:
        return new
    cut = _cut(new)
    if cut <= 0:
        return new  # one line and nothing before it: nothing whole to move
    try:
        _append(root, new[:cut])
    except (OSError, PersonaError) as exc:  # housekeeping: the write itself still goes ahead
        _log.warning("memory.log_not_archived", path=ARCHIVE, error=str(exc))
        return new
    return new[cut:]


def _cut(data: bytes) -> int:
    """Where the newest :data:`KEEP` bytes of whole lines begin (0: nothing to cut)."""
    start = data.find(b"\n", len(data) - KEEP)
    if start < 0 or start + 1 >= len(data):
        # The newest line alone is longer than KEEP: keep just it.
        start = data.rfind(b"\n", 0, len(data) - 1)
    return start + 1


def _append(root: str | os.PathLike[str], data: bytes) -> None:
    directory = make_dirs(root, confined(root, os.path.dirname(ARCHIVE)))
    path = confined(root, ARCHIVE)
    created = not os.path.lexists(path)
    # Under the log's lock: a FIFO planted at the archive's name must not block the open.
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    if not data.endswith(b"\n"):
        data += b"\n"
    write_synced(fd, data)
    if created:
        fsync_directory(directory)

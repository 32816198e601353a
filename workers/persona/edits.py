"""A persona caught mid-edit: a load failure right after its files changed is not final.

Why: the fleet runs while people edit personas. An editor's save, or a typo fixed seconds
later, can be what a turn starting at that moment reads; failing permanently then would
dead-letter the lane (heartbeats and replies stop until someone runs ``soulfleet revive``) for
a file that is already fine again. A failure that would be permanent is made transient
(:class:`~workers.persona.errors.PersonaEditing`) while the newest modification of the
persona's directory or its top-level files is younger than :data:`EDIT_GRACE_SECONDS`; the
lane's retry then reads the files again, and a persona still failing once they have been still
that long is dead-lettered as before.
"""

from __future__ import annotations

import os
import time

from workers.persona.errors import PersonaEditing, failure_kind

__all__ = ["EDIT_GRACE_SECONDS", "last_change", "while_editing"]

#: How long after a change to its files a persona that fails to load is retried, not given up.
EDIT_GRACE_SECONDS = 60.0


def last_change(home: str | os.PathLike[str]) -> float | None:
    """The newest modification time (epoch seconds) of ``home`` itself (a save by rename, as
    editors and ``sed -i`` do, or a file moved in, changes it) and of the regular files directly
    in it; None if it cannot be listed."""
    try:
        newest = os.stat(home).st_mtime
        with os.scandir(home) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    except OSError:
        return None
    return newest


def while_editing(
    exc: BaseException, home: str | os.PathLike[str], now: float | None = None
) -> BaseException:
    """``exc``, or a :class:`PersonaEditing` raised from it when it would fail the turn for
    good and ``home``'s files changed less than :data:`EDIT_GRACE_SECONDS` before ``now``
    (the wall clock the files were stamped by, not a fleet's clock: a test's virtual one
    would make every file look new or old)."""
    if failure_kind(exc) != "permanent":
        return exc
    now = time.time() if now is None else now
    changed = last_change(home)
    if changed is None or now - changed >= EDIT_GRACE_SECONDS:
        return exc
    editing = PersonaEditing(exc, max(0.0, now - changed), EDIT_GRACE_SECONDS)
    editing.__cause__ = exc
    return editing

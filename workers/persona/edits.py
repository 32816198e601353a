"""A persona caught mid-edit: a load failure right after its files changed is not final.

Why: the fleet runs while people edit personas. An editor's save, or a typo fixed seconds
later, can be what a turn starting at that moment reads; failing permanently then would
dead-letter the lane (heartbeats and replies stop until someone runs ``soulfleet revive``) for
a file that is already fine again. A failure of the persona's own configuration (its
``persona.toml``, a ``[[tools]]`` entry, a scripted rules file in its directory) that would be
permanent is made transient (:class:`~workers.persona.errors.PersonaEditing`) while the newest
modification of its configuration files (the ``.toml`` and ``.json`` files directly in its
directory: an editor's save by rename leaves a file stamped now) is younger than
:data:`EDIT_GRACE_SECONDS`; the lane's retry then reads them again, and a persona still
failing once they have been still that long is dead-lettered as before. The files the
persona writes itself (MEMORY.md, USER.md) never count, nor a fleet-wide setting's failure.

A persona whose directory is gone (:class:`~workers.persona.errors.PersonaNotFound`, at the
turn's start or as it saves its session) gets the same grace from the last change of the
personas root: moving a directory aside to swap a new version in is a change there, and a
turn caught between the two renames is retried instead of dead-lettered.
"""

from __future__ import annotations

import os
import time

from workers.persona.errors import (
    ModelSpecError,
    PersonaConfigError,
    PersonaEditing,
    PersonaNotFound,
    causes,
    failure_kind,
)

__all__ = ["CONFIG_SUFFIXES", "EDIT_GRACE_SECONDS", "last_change", "while_editing"]

#: How long after a change to its files a persona that fails to load is retried, not given up.
EDIT_GRACE_SECONDS = 60.0
#: The persona's configuration files, by suffix (persona.toml, scripted rules files).
CONFIG_SUFFIXES = (".toml", ".json")


def last_change(home: str | os.PathLike[str]) -> float | None:
    """The newest modification time (epoch seconds) of the configuration files directly in
    ``home`` (:data:`CONFIG_SUFFIXES`); None if there is none or it cannot be listed."""
    newest: float | None = None
    try:
        with os.scandir(home) as entries:
            for entry in entries:
                if entry.name.endswith(CONFIG_SUFFIXES) and entry.is_file(follow_symlinks=False):
                    stamp = entry.stat(follow_symlinks=False).st_mtime
                    newest = stamp if newest is None else max(newest, stamp)
    except OSError:
        return None
    return newest


def _stamp(path: str) -> float | None:
    """``path``'s modification time, None if it cannot be read."""
    try:
        return os.stat(path).st_mtime
    except (OSError, ValueError):
        return None


def _own(exc: BaseException, home: str | os.PathLike[str]) -> bool:
    """Whether ``exc`` is a failure of the persona's own configuration: persona.toml or a
    tool entry in it, or a model spec naming a file in its directory (its rules file)."""
    if isinstance(exc, PersonaConfigError):
        return True
    return isinstance(exc, ModelSpecError) and os.fspath(home) in str(exc)


def while_editing(
    exc: BaseException,
    home: str | os.PathLike[str],
    now: float | None = None,
    *,
    gone: bool = False,
    moved_grace: bool = True,
) -> BaseException:
    """``exc``, or a :class:`PersonaEditing` raised from it when it is a permanent failure of
    the persona's own configuration and those files changed less than
    :data:`EDIT_GRACE_SECONDS` before ``now`` (the wall clock the files were stamped by, not a
    fleet's clock: a test's virtual one would make every file look new or old; a file stamped
    in the future, a clock's skew, is no edit). ``gone``: the caller found no directory at
    ``home`` (the fleet's own "unknown persona"), which :class:`PersonaNotFound` says too.
    ``moved_grace`` False: the lane has been failing for longer than the grace (the caller
    knows since when): any change to the personas root (another persona created) would
    otherwise keep a removed persona's lane retrying instead of dead-lettered."""
    if failure_kind(exc) != "permanent":
        return exc
    if _own(exc, home):
        changed, what = last_change(home), "the persona's files"
    elif not moved_grace:
        return exc
    elif gone or any(isinstance(cause, PersonaNotFound) for cause in causes(exc, context=True)):
        # Its directory moved aside (a new version swapped in by two renames): the rename
        # stamps the personas root, which is all there is left to look at.
        changed, what = _stamp(os.path.dirname(os.fspath(home).rstrip(os.sep))), "its directory"
    else:
        return exc
    now = time.time() if now is None else now
    if changed is None or not 0 <= now - changed < EDIT_GRACE_SECONDS:
        return exc
    editing = PersonaEditing(exc, now - changed, EDIT_GRACE_SECONDS, what=what)
    editing.__cause__ = exc
    return editing

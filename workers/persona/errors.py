"""Every exception soulfleet raises, drawn here first so callers know what to catch.

::

    SoulfleetError
    ├── SettingsError            a bad environment variable (names it)
    ├── PersonaError             a persona directory that cannot be used
    │   ├── PersonaNotFound      the directory does not exist
    │   ├── PersonaFileError     a bootstrap file is unreadable, or is a directory (names the path)
    │   ├── PersonaConfigError   persona.toml is invalid (names the key)
    │   ├── PersonaEditing       one of those, met while the persona's files were being changed
    │   ├── LockTimeout          a persona file stayed locked past the lock timeout
    │   ├── ToolSetupSlow        a Python tool's module import or factory outran its time limit
    │   └── StorageUnavailable   a persona directory's filesystem is full, read-only or refusing
    ├── ModelError               a model call failed; turned into an "error" RunResult by the loop
    │   ├── ModelSpecError       a model spec string that names no model ("openai:", "foo:bar")
    │   ├── ModelAuthError       401/403, or no API key configured
    │   ├── ModelRateLimited     429 and every retry used
    │   ├── ModelServerError     5xx and every retry used
    │   ├── ModelRequestError    another 4xx: the request itself was refused
    │   ├── ModelTimeout         no answer within the request timeout, every retry used
    │   ├── TurnTimeUp           the turn's own time limit ended the call (not the provider's fault)
    │   ├── ModelUnreachable     connection refused / DNS failure, every retry used
    │   └── ModelResponseError   the provider answered something we cannot parse
    └── TurnAborted              raised by a turn guard to stop a turn before its next write
                                 (the fleet's LeaseLost is one); the loop never swallows it

Tool misuse is never an exception: tools return an error ``ToolResult`` the model can act on.
Messages never contain API keys or passwords.

Failures by kind. Every class here says whether a failed turn it ends should be tried again
(``retryable``), and :func:`failure_kind` turns any exception into one of three kinds, so the
fleet decides "retry or dead-letter" from the class, never from an error message:

- ``transient``: the world may well change by itself (connect errors, timeouts, 5xx, 429, a
  malformed provider reply, a lock held too long, Redis blips, a persona filesystem that is full,
  read-only or refuses the worker's user: ``ENOSPC``, ``EDQUOT``, ``EROFS``, ``EACCES``,
  ``EPERM``, unless a class in the chain already decided, as an unreadable bootstrap file's
  ``PersonaFileError`` does). Retried with backoff for up to
  ``SOULFLEET_RETRY_FOR`` of continuous failure.
- ``permanent``: asking again cannot help until someone fixes something (401/403, an unknown
  model or another refused request, an invalid persona file, a bad setting). Dead-lettered at
  once, with the reason; except a persona that fails to load within a minute of a change to
  its files (``PersonaEditing``: an editor's save caught half-way, a typo fixed seconds later),
  which is retried until its files have been still that long.
- ``unknown``: anything not classified (a bug, an unexpected ``OSError``). Retried with backoff
  but only ``SOULFLEET_MAX_ATTEMPTS`` times in a row, as every failure was before kinds existed.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import ClassVar, Literal

__all__ = [
    "STORAGE_ERRNOS",
    "FailureKind",
    "LockTimeout",
    "ModelAuthError",
    "ModelError",
    "ModelRateLimited",
    "ModelRequestError",
    "ModelResponseError",
    "ModelServerError",
    "ModelSpecError",
    "ModelTimeout",
    "ModelUnreachable",
    "PersonaConfigError",
    "PersonaEditing",
    "PersonaError",
    "PersonaFileError",
    "PersonaNotFound",
    "SettingsError",
    "SoulfleetError",
    "StorageUnavailable",
    "ToolSetupSlow",
    "TurnAborted",
    "TurnTimeUp",
    "causes",
    "failure_kind",
]

FailureKind = Literal["transient", "permanent", "unknown"]

#: What a filesystem answers when it is full (or over quota), mounted read-only, or refuses
#: the worker's user (a wrong owner or mode after a restore, an immutable directory): the files
#: are fine, the place is not, and someone freeing space, remounting or fixing the ownership
#: fixes it (transient: the lane waits, refused before each model call, and goes on by itself;
#: as an unknown failure it was dead-lettered after 5 quick attempts).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


class SoulfleetError(Exception):
    """Base of every soulfleet error. ``retryable``: True transient, False permanent, None
    not classified (see :func:`failure_kind`)."""

    retryable: ClassVar[bool | None] = None


def failure_kind(exc: BaseException) -> FailureKind:
    """The kind of a turn failure, read from the exception's class (and its causes).

    A plain ``TimeoutError`` or ``ConnectionError`` is transient, and so is an ``OSError`` of a
    full, read-only or refusing filesystem (:data:`STORAGE_ERRNOS`); the fleet adds Redis's own
    exceptions in :func:`workers.fleet.errors.classify`.
    """
    for current in causes(exc):
        retryable = getattr(type(current), "retryable", None)
        if isinstance(current, SoulfleetError) and retryable is not None:
            return "transient" if retryable else "permanent"
        if isinstance(current, (TimeoutError, ConnectionError)):
            return "transient"
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return "transient"
    return "unknown"


def causes(exc: BaseException | None, *, context: bool = False) -> Iterator[BaseException]:
    """``exc``, then what it was raised from (``__cause__``), each once; with ``context``, also
    what was being handled when one was raised (``__context__``: a library re-raising as its
    own class without ``from``)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = (exc.__cause__ or exc.__context__) if context else exc.__cause__


class SettingsError(SoulfleetError):
    """An environment variable holds a value soulfleet cannot use."""

    retryable = False

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable} {problem}")
        self.variable = variable
        self.problem = problem


class PersonaError(SoulfleetError):
    """A persona directory cannot be used as it is (permanent: someone must fix the files)."""

    retryable = False


class PersonaNotFound(PersonaError):
    """The persona directory does not exist (or is not a directory)."""

    def __init__(self, path: object, detail: str = "") -> None:
        message = f"persona directory not found: {path}"
        super().__init__(f"{message} ({detail})" if detail else message)
        self.path = path


class PersonaFileError(PersonaError):
    """A file inside the persona directory cannot be read as a file."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class PersonaConfigError(PersonaError):
    """persona.toml is malformed, has an unknown key or a bad value."""

    def __init__(self, path: object, key: str | None, problem: str) -> None:
        where = f"{path}: " if path is not None else ""
        what = f"key {key!r} " if key else ""
        super().__init__(f"{where}{what}{problem}")
        self.path = path
        self.key = key
        self.problem = problem


class PersonaEditing(PersonaError):
    """A persona failed to load (``__cause__``: how) while its files were being changed: the
    edit may be unfinished, so the turn is retried; once the files have been still for
    ``grace`` seconds, the same failure is permanent again."""

    retryable = True

    def __init__(
        self, cause: BaseException, age: float, grace: float, *, what: str = "the persona's files"
    ) -> None:
        # The cause's class stays in the text: `revive --reason PersonaConfigError` and the
        # fixed-since check find the lane by it.
        super().__init__(
            f"{type(cause).__name__}: {cause}; {what} changed {age:.0f}s ago, so "
            f"this may be an edit in progress: the turn is retried (a persona still failing "
            f"{grace:.0f}s after its last change is dead-lettered)"
        )
        self.age = age
        self.grace = grace


class LockTimeout(PersonaError):
    """A persona file's lock was not acquired within the timeout (names the file and timeout).

    Transient: the holder finishes, or its claim is broken, and the next try gets the lock."""

    retryable = True

    def __init__(
        self, path: object, timeout: float, mode: str, holders: tuple[str, ...] = ()
    ) -> None:
        held = f": {', '.join(holders)}" if holders else ""
        super().__init__(f"{path}: lock not acquired within {timeout:g}s ({mode} lock mode{held})")
        self.path = path
        self.timeout = timeout
        self.mode = mode
        self.holders = holders


#: What to do, by what the filesystem answered (0: full or read-only, the default).
_STORAGE_FIX = {
    0: "Free space on that filesystem or remount it read-write",
    errno.EACCES: "Give the worker's user write access to the persona directory (its owner and "
    "mode: `ls -ln` it beside a working persona's)",
    errno.EPERM: "Give the worker's user write access to the persona directory (its owner, "
    "and no immutable flag: `lsattr -d` it)",
}


class ToolSetupSlow(PersonaError):
    """A ``[[tools.python]]`` entry's module import, or its factory, still running at its time
    limit (names the file and key). Transient: a cold import (a large library, a slow
    filesystem, many threads importing at once) finishes meanwhile, and the retry finds the
    module imported; one that never finishes fails every try until the lane is dead-lettered.
    """

    retryable = True

    def __init__(self, source: object, key: str, problem: str) -> None:
        super().__init__(f"{source}: key {key!r} {problem}")
        self.source = source
        self.key = key
        self.problem = problem


class StorageUnavailable(PersonaError):
    """The filesystem holding a persona directory cannot take the turn's files: full, over
    quota, read-only, or refusing the worker's user (names the directory and what it answered).

    Transient: freeing space, remounting or fixing the ownership fixes it, and the lane carries
    on by itself. Raised
    before the model call when the worker can tell (:func:`workers.persona.storage.check`),
    so a turn that could not be saved is not paid for."""

    retryable = True

    def __init__(self, home: object, problem: str, code: int | None = None) -> None:
        """``code``: the errno the filesystem answered, when one did (it picks the advice)."""
        super().__init__(
            f"persona storage unavailable at {home}: {problem}; the turn runs again with "
            "backoff for up to SOULFLEET_RETRY_FOR (its inbox items are kept). "
            + _STORAGE_FIX.get(code or 0, _STORAGE_FIX[0])
        )
        self.home = home
        self.problem = problem


class ModelError(SoulfleetError):
    """A model call failed. ``retryable`` says whether a later turn may well succeed;
    ``retry_after`` (seconds), when set, is how long the provider asked to be left alone: the
    turn's retry waits at least that long."""

    retryable = False
    retry_after: float | None = None


class ModelSpecError(ModelError):
    """A model spec string that names no usable model."""


class ModelAuthError(ModelError):
    """The provider refused our credentials, or none are configured."""


class ModelRateLimited(ModelError):
    """The provider kept answering 429 after every retry."""

    retryable = True


class ModelServerError(ModelError):
    """The provider kept answering 5xx after every retry."""

    retryable = True


class ModelRequestError(ModelError):
    """The provider refused the request itself (a 4xx other than 401/403/429)."""


class ModelTimeout(ModelError):
    """No answer within the request timeout on every try."""

    retryable = True


class TurnTimeUp(ModelError):
    """The running turn's ``max_seconds`` ran out before or during a model call (a try cut at
    the turn's limit, or no time left for one): the turn ends ``incomplete`` (``max_seconds``)
    as it would between calls. Not evidence against the provider: its breaker never counts it.
    """

    retryable = True


class ModelUnreachable(ModelError):
    """The provider's host could not be reached on every try."""

    retryable = True


class ModelResponseError(ModelError):
    """The provider's answer was not what its wire protocol promises.

    Transient: a provider in trouble answers a truncated or garbled 200 for a while, then
    recovers; a client bug would show on every call and trip the provider breaker instead."""

    retryable = True


class TurnAborted(SoulfleetError):
    """A turn guard stopped the turn; the loop lets this propagate to the runtime."""

    retryable = None

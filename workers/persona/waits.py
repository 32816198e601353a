"""Waits: the places where the persona core blocks on something other than its own CPU.

A flushed write (``fsync``), a sleep between retries, a lock another writer holds: while a
thread waits there it needs no CPU, and a host running many turns in one process can let
another turn run meanwhile. The core marks those places with :func:`waiting` and knows nothing
of who listens; a worker installs a hook (:func:`set_wait_hook`: the fleet's
:class:`~workers.turn.baton.Baton`, which lets one turn at a time run its Python work and hands
the turn on at every wait). With no hook, a wait costs one global read.

A wait is *brief* when it usually lasts well under a millisecond and the thread has work to
finish right after it (a disk flush, a Redis reply): a hook may then give the waiting thread
its place back first. A hook must be cheap and must never raise: it wraps every disk flush of
a turn.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

__all__ = ["WaitHook", "fdatasync", "fsync", "set_wait_hook", "sleep", "waiting"]

_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()
WaitHook = Callable[[bool], AbstractContextManager[object]]
_hook: WaitHook | None = None


def set_wait_hook(hook: WaitHook | None) -> None:
    """Wrap every wait of the core in ``hook(brief)`` (None: no hook)."""
    global _hook  # noqa: PLW0603
    _hook = hook


def waiting(*, brief: bool = False) -> AbstractContextManager[object]:
    """A context manager around a wait: the installed hook's, or one that does nothing."""
    hook = _hook
    return _NOTHING if hook is None else hook(brief)


def fsync(fd: int) -> None:
    """``os.fsync(fd)``, marked as a brief wait."""
    with waiting(brief=True):
        os.fsync(fd)


def fdatasync(fd: int) -> None:
    """``os.fdatasync(fd)`` (``os.fsync`` where there is none), marked as a brief wait."""
    with waiting(brief=True):
        getattr(os, "fdatasync", os.fsync)(fd)


def sleep(seconds: float) -> None:
    """``time.sleep(seconds)``, marked as a wait."""
    with waiting():
        time.sleep(seconds)

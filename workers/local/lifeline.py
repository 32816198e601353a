"""Children that die with their parent: the parent-death signal of ``soulfleet up``'s processes.

``up`` owns the processes it starts. A clean stop (Ctrl-C, SIGTERM, SIGHUP, a closed output
pipe) stops them in order; but ``up`` itself may be SIGKILLed (an OOM kill, ``kill -9``, a
terminal emulator that gives up), and a fleet that outlives its terminal keeps writing to the
data folder a new ``up`` would use. On Linux the kernel can signal a child when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), set between fork and exec; it survives the exec. The second
line of defence is the data folder's lock, which every child inherits (see
:mod:`workers.local.datadir`): a child that somehow survives keeps the folder locked, so no
second ``up`` starts next to it.

Two details that matter:

- The signal is sent when the THREAD that forked the child exits, so children must be started
  from a thread that lives as long as ``up`` (its main thread does).
- If the parent died between fork and ``prctl``, no signal will ever come; the child checks
  its parent pid right after and signals itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["PR_SET_PDEATHSIG", "die_with_parent", "supported"]

PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


# Loaded once in the parent: between fork and exec only async-signal-safe work is wise, and
# dlopen is not.
_LIBC = _libc()


def supported() -> bool:
    """Whether this platform can signal a child when its parent dies."""
    return _LIBC is not None


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when this process dies.

    None where the platform has no parent-death signal (the inherited lock still guards the
    data folder there).
    """
    libc = _LIBC
    if libc is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), int(sig))

    return preexec

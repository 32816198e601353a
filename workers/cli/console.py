"""The terminal of a long-running command, which may go away while the command runs.

``soulfleet up`` writes to its terminal for as long as the fleet runs. That terminal can close
(SIGHUP, then every write fails with EIO) or its output can be a pipe whose reader left
(``soulfleet up | head -30``: EPIPE). Either way the person who started the fleet can no longer
see or stop it, so the right reaction is the same as to Ctrl-C: stop the fleet in order, and
never die half-way through that because a goodbye line could not be written.

:class:`Console` is that output: a write that fails marks the stream closed, points its file
descriptor at ``/dev/null`` (so nothing later, not even the interpreter's final flush, trips on
it again) and calls ``on_closed`` once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

import click

__all__ = ["Console", "StopRequest", "safe_write"]


def safe_write(fd: int, text: str) -> bool:
    """``os.write`` for signal handlers (no buffered stream, no reentrancy); False if closed."""
    try:
        os.write(fd, text.encode())
    except OSError:
        return False
    return True


def _silence(stream_fd: int) -> None:
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream_fd)
        os.close(devnull)


class Console:
    """stdout and stderr writes that survive a closed terminal or a broken pipe."""

    def __init__(self, on_closed: Callable[[str], None] | None = None) -> None:
        self.on_closed = on_closed
        self.closed: set[str] = set()

    def echo(self, text: str = "", *, err: bool = False) -> None:
        name = "stderr" if err else "stdout"
        if name in self.closed:
            return
        try:
            click.echo(text, err=err)
            (sys.stderr if err else sys.stdout).flush()
        except OSError:  # EPIPE from a pipe whose reader left, EIO from a hung-up terminal
            self._closed(name)

    def out(self, text: str) -> None:
        self.echo(text)

    def err(self, text: str) -> None:
        self.echo(text, err=True)

    def _closed(self, name: str) -> None:
        self.closed.add(name)
        stream = sys.stderr if name == "stderr" else sys.stdout
        try:
            fd = stream.fileno()
        except (OSError, ValueError):
            fd = 2 if name == "stderr" else 1
        _silence(fd)
        if self.on_closed is not None:
            self.on_closed(name)


@dataclass
class StopRequest:
    """Set by SIGINT, SIGTERM or SIGHUP, or a closed output: the first asks for a clean stop,
    a second signal for a forced one."""

    requested: threading.Event = field(default_factory=threading.Event)
    force: bool = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.requested.is_set():
            self.force = True
        self.requested.set()
        # os.write, not click.echo: a handler that writes to a buffered stream the main thread
        # is writing to raises "reentrant call". After SIGHUP the terminal is gone: no matter.
        what = "killing what is left" if self.force else "stopping the fleet (again to force)"
        safe_write(2, f"\n{signal.Signals(signum).name}: {what}...\n")

    def output_closed(self, name: str) -> None:
        """A write to the terminal failed: nobody can watch or Ctrl-C this fleet any more."""
        if not self.requested.is_set():
            safe_write(2, f"soulfleet up: {name} closed: stopping the fleet...\n")
        self.requested.set()

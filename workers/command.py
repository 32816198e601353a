"""The ``soulfleet`` console script: the command line, imported while a Ctrl-C is only noted.

Why a module of its own: importing :mod:`workers.cli` (click, Celery, redis-py, every command)
takes a few hundred milliseconds, and a Ctrl-C in that time printed a Python traceback (or one
of an exception the interrupt surfaced through, or was lost and the command ran anyway) where
click prints ``Aborted!`` once a command runs. While the import runs, SIGINT only sets a flag;
once it is done, a Ctrl-C that came is answered as click answers one.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

__all__ = ["main"]


def main() -> None:
    """Console-script entry point (``soulfleet = "workers.command:main"``)."""
    interrupted: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        interrupted.append(signum)

    previous = signal.getsignal(signal.SIGINT)
    # An interrupt the caller ignores (`trap '' INT`, nohup) stays ignored; one handled outside
    # Python (None) could not be put back, so it is left alone too.
    guard = previous not in (signal.SIG_IGN, None)
    if guard:
        signal.signal(signal.SIGINT, note)
    try:
        from workers.cli import main as run_cli  # noqa: PLC0415 (while SIGINT is only noted)
    finally:
        if guard:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    run_cli()

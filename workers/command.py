"""The ``soulfleet`` console script: the command line, imported inside the Ctrl-C guard.

Why a module of its own: importing :mod:`workers.cli` (click, Celery, redis-py, every command)
takes a few hundred milliseconds, and a Ctrl-C in that time printed a Python traceback where
click prints ``Aborted!`` once a command runs. Here the import happens inside the guard.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Console-script entry point (``soulfleet = "workers.command:main"``)."""
    try:
        from workers.cli import main as run_cli  # noqa: PLC0415 (inside the guard)
    except KeyboardInterrupt:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    run_cli()

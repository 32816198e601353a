"""The settings of a worker or beat process, read before anything imports the metrics.

:mod:`workers.celery` imports :data:`settings` first: a prefork worker serving metrics must name
its metric files' directory before :mod:`workers.metrics` builds the first metric
(:mod:`workers.metric_files`), and which pool it runs is a setting (or its command line).
"""

from __future__ import annotations

import os
import sys

from workers.metric_files import share
from workers.settings import Settings, SettingsError

__all__ = ["PREFORK", "pool_asked", "settings", "settings_or_exit"]

#: The names Celery's command line takes for the prefork pool.
PREFORK = frozenset({"prefork", "processes"})


def settings_or_exit() -> Settings:
    """Settings, or a one-line error naming the variable and exit 2 (no traceback: a typo in the
    environment is bad input, and a worker must never start on it and fail every turn)."""
    environ = dict(os.environ)
    if pool_asked(sys.argv) in PREFORK:
        # Celery cannot tell `-P prefork` from its own default and then takes the configured
        # pool (threads, unless SOULFLEET_WORKER_POOL says otherwise): a worker asked for
        # prefork ran threads without a word. What the command line asks for wins, as for every
        # other pool, with prefork's own default concurrency (2 per core) unless one is set.
        environ["SOULFLEET_WORKER_POOL"] = "prefork"
    try:
        return Settings.from_env(environ)
    except SettingsError as exc:
        sys.stderr.write(f"soulfleet: error: {exc}\n")
        raise SystemExit(2) from None


def pool_asked(argv: list[str]) -> str | None:
    """The pool a ``celery worker`` command line names (``-P X``, ``-PX``, ``--pool X``,
    ``--pool=X``), or None."""
    for index, arg in enumerate(argv):
        if arg in ("-P", "--pool") and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--pool="):
            return arg.removeprefix("--pool=")
        if arg.startswith("-P") and len(arg) > 2:
            return arg[2:]
    return None


settings = settings_or_exit()
if "worker" in sys.argv[1:]:  # a `celery worker` (beat serves its own process only)
    asked = pool_asked(sys.argv)
    share("prefork" if asked in PREFORK else asked or settings.worker_pool, settings.metrics_port)

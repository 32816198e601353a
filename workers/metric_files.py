"""Metric files: how a prefork worker's children count into the endpoint of their parent.

Why (issue 15's pools): the prefork pool runs turns in child processes, and each counted its
turns, model calls and tokens in its own memory, which the parent's ``/metrics`` never saw: a
prefork worker's dashboard showed an idle fleet. prometheus_client's multiprocess mode keeps
every process's values in files of one directory (``PROMETHEUS_MULTIPROC_DIR``), which the
parent's endpoint reads and sums (:func:`workers.metrics.serve_metrics`). The directory must be
named before the first metric is constructed, so :mod:`workers.process_settings`, which
:mod:`workers.celery` imports first, calls :func:`share` before anything imports
:mod:`workers.metrics`, where the store of every process's values is chosen from it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

__all__ = ["ENV", "share", "shared"]

ENV = "PROMETHEUS_MULTIPROC_DIR"


_sharing = False


def share(pool: str | None, port: int) -> bool:
    """For a prefork worker serving metrics (``port`` > 0): a fresh directory for its
    processes' metric files, removed when the worker exits, named in :data:`ENV` (which its
    children inherit). True when the worker's metrics are shared now; False for another pool,
    with metrics off, or when soulfleet's metrics exist already (too late: the worker then
    warns, ``metrics.prefork_blind``). A :data:`ENV` already in the environment is replaced:
    shared with other processes (``soulfleet up`` passes its environment to every worker and
    to beat), each endpoint would sum them all."""
    global _sharing  # noqa: PLW0603
    if pool != "prefork" or port <= 0 or "workers.metrics" in sys.modules:
        return False
    directory = tempfile.mkdtemp(prefix="soulfleet-metrics-")
    os.environ[ENV] = directory
    atexit.register(_remove, directory, os.getpid())
    _sharing = True
    return True


def shared() -> bool:
    """Whether this process is (or was forked from) a prefork worker whose endpoint sums its
    processes' metric files. Any other process serves its own values, whatever :data:`ENV`
    says."""
    return _sharing


def _remove(directory: str, owner: int) -> None:
    if os.getpid() == owner:  # a child that runs atexit hooks must not remove its parent's
        shutil.rmtree(directory, ignore_errors=True)

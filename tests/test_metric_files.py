"""metric_files.py: when a worker's processes share metric files, and when they cannot."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workers import metric_files
from workers.metric_files import ENV, share

_AFTER_FLOWER = """
import os, sys
import prometheus_client  # as Celery's command line does, loading Flower's plugin
from workers.metric_files import share
print(share("prefork", 9100), os.environ["PROMETHEUS_MULTIPROC_DIR"])
from workers import metrics
metrics.TURNS.labels(kind="interactive", status="done").inc()
print(sorted(os.listdir(os.environ["PROMETHEUS_MULTIPROC_DIR"])))
"""


def test_a_prefork_worker_shares_its_metric_files_even_after_flower_imported_the_client() -> None:
    """prometheus_client imported first (Celery loads Flower's command, which imports it):
    the worker's metrics still go to files of a directory of its own, removed at its exit."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    done = subprocess.run(
        [sys.executable, "-c", _AFTER_FLOWER], capture_output=True, text=True, env=env, check=True
    )
    first, files = done.stdout.splitlines()
    shared, directory = first.split(" ", 1)
    assert shared == "True"
    assert files.startswith("['counter_")
    assert not os.path.exists(directory)


@pytest.mark.parametrize(("pool", "port"), [("threads", 9100), ("gevent", 9100), ("prefork", 0)])
def test_other_pools_or_metrics_off_share_nothing(
    pool: str, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert not share(pool, port)
    assert ENV not in os.environ


def test_too_late_once_soulfleets_metrics_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metrics already constructed count in memory: nothing is switched (the worker warns)."""
    monkeypatch.delenv(ENV, raising=False)
    import workers.metrics  # noqa: F401, PLC0415

    assert not share("prefork", 9100)
    assert not metric_files.shared()

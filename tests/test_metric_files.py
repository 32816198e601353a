"""metric_files.py: when a worker's processes share metric files, and when they cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

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


def test_a_directory_in_the_environment_is_not_used_by_other_processes() -> None:
    """PROMETHEUS_MULTIPROC_DIR set for every process (as `up` passes its environment on): a
    process that is not a prefork worker keeps and serves its own values, writes no file
    there (another program's sum would count it), and does not fail on one that is gone."""
    script = (
        "import sys\n"
        "from workers import metric_files, metrics\n"
        "from prometheus_client import generate_latest\n"
        "metrics.TURNS.labels(kind='interactive', status='done').inc(2)\n"
        "print(metric_files.shared())\n"
        "print(generate_latest(metrics._served(None)).decode())\n"
    )
    directory = tempfile.mkdtemp()
    first = {**os.environ, ENV: directory}
    subprocess.run([sys.executable, "-c", script], env=first, check=True, capture_output=True)
    done = subprocess.run(
        [sys.executable, "-c", script], env=first, check=True, capture_output=True, text=True
    )
    assert done.stdout.splitlines()[0] == "False"
    assert 'soulfleet_turns_total{kind="interactive",status="done"} 2.0' in done.stdout
    assert os.listdir(directory) == []
    gone = {**os.environ, ENV: os.path.join(directory, "gone")}
    subprocess.run([sys.executable, "-c", script], env=gone, check=True, capture_output=True)

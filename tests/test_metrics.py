"""workers/metrics.py: the /metrics endpoint of a worker or beat process."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import urllib.request

import pytest
from structlog.testing import capture_logs

from tests.support.fleet import wait_until
from workers.metrics import serve_metrics


def _scrape(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return bool(response.status == 200 and b"soulfleet_" in response.read())
    except OSError:
        return False


def test_a_taken_port_is_served_once_it_is_free() -> None:
    """A worker restarted while the old one still held the port logged port_unavailable once
    and ran without /metrics until its next restart: now it binds the port once it is free,
    and says so."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    with capture_logs() as logs:
        assert serve_metrics(port, retry_every=0.05) is False
        assert [e["event"] for e in logs] == ["metrics.port_unavailable"]
        assert not _scrape(port)
        holder.close()
        wait_until(lambda: _scrape(port), timeout=10, what="/metrics on the freed port")
    serving = [e for e in logs if e["event"] == "metrics.serving"]
    assert len(serving) == 1
    assert serving[0]["port"] == port
    assert serving[0]["tries"] >= 2


def test_no_retry_when_asked_for_none() -> None:
    """retry_every=0: a taken port stays a logged error (no thread keeps trying)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with capture_logs() as logs:
            assert serve_metrics(port, retry_every=0) is False
        assert logs[0]["retry_every"] is None
        retrying = [t for t in threading.enumerate() if t.name == "soulfleet-metrics-retry"]
        assert retrying == []
    finally:
        holder.close()


def test_a_host_that_is_not_this_machines_is_blamed_not_the_port() -> None:
    """SOULFLEET_METRICS_HOST naming no address of this machine (here TEST-NET-1, never
    assigned) is logged as the host's problem with the setting to fix, not as a taken port."""
    with capture_logs() as logs:
        assert serve_metrics(free_port(), host="192.0.2.1", retry_every=0) is False
    (event,) = logs
    assert event["event"] == "metrics.host_unavailable"
    assert event["host"] == "192.0.2.1"
    assert "SOULFLEET_METRICS_HOST" in event["hint"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_SCRAPE = """
import importlib, sys
from prometheus_client import REGISTRY, generate_latest
importlib.import_module(sys.argv[1])
sys.stdout.write(generate_latest(REGISTRY).decode())
"""
_BEAT_ONLY = (
    "soulfleet_last_sweep_timestamp_seconds",
    "soulfleet_sweep_due",
    "soulfleet_sweep_seconds",
    "soulfleet_provider_breaker_open",
    "soulfleet_registry_invalid_personas",
    "soulfleet_redis_data_lost_total",
    "soulfleet_ticks_total",
    "soulfleet_ticks_skipped_total",
)


@pytest.mark.parametrize(
    ("process", "module"), [("worker", "workers.celery"), ("beat", "beat.scheduler")]
)
def test_only_beat_exports_what_only_beat_measures(process: str, module: str) -> None:
    """A worker's scrape shows none of beat's sweep, tick, registry or breaker metrics (each
    was a 0 from every worker, read by any query without a job filter); beat's shows them."""
    scrape = subprocess.run(
        [sys.executable, "-c", _SCRAPE, module], capture_output=True, text=True, check=True
    ).stdout
    assert "soulfleet_turns_total" in scrape  # the scrape itself works in both
    shown = {name for name in _BEAT_ONLY if f"# TYPE {name} " in scrape}
    assert shown == (set(_BEAT_ONLY) if process == "beat" else set()), process


def test_the_series_alerts_watch_are_exported_from_zero_at_start() -> None:
    """A fresh process exported soulfleet_turns_total{status="error"}, the memory write
    failures, the reaper's repairs and the Redis connection waits only after their first
    event, and Prometheus's increase() does not count a series' first appearance: the first
    failure of each kind in each process never fired its alert. Checked in a new interpreter,
    where nothing has happened yet."""
    script = (
        "from prometheus_client import generate_latest\n"
        "import workers.metrics\n"
        "print(generate_latest().decode())\n"
    )
    text = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for series in (
        'soulfleet_turns_total{kind="heartbeat",status="error"} 0.0',
        'soulfleet_memory_write_failures_total{reason="os_error"} 0.0',
        'soulfleet_reaper_repairs_total{reason="lease_expired"} 0.0',
        'soulfleet_redis_connection_wait_seconds_count{client="coordination"} 0.0',
    ):
        assert series in text, series

"""workers/metrics.py: the /metrics endpoint of a worker or beat process."""

from __future__ import annotations

import socket
import threading
import urllib.request

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

"""ops/healthcheck.py (the image's ``soulfleet-healthcheck``) against real HTTP servers.

It runs as Docker runs it: a subprocess whose exit code is the verdict. beat is healthy only
while its own newest sweep is recent; the metrics come from a real prometheus_client exporter.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.support.ops import OPS
from workers.local.redis_server import free_port

SCRIPT = OPS / "healthcheck.py"


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


class Exporter:
    """A real metrics endpoint on a private registry, like a beat's."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.server, self.thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = int(self.server.server_port)

    def last_sweep(self, value: float) -> None:
        Gauge("soulfleet_last_sweep_timestamp_seconds", "newest sweep", registry=self.registry).set(
            value
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    running = Exporter()
    yield running
    running.close()


def test_beat_is_healthy_right_after_a_sweep(exporter: Exporter) -> None:
    """A sweep that just finished: exit 0."""
    exporter.last_sweep(time.time())
    result = _check("beat", "--port", str(exporter.port), "--max-age", "60")
    assert result.returncode == 0, result.stderr


def test_beat_is_unhealthy_when_its_newest_sweep_is_old(exporter: Exporter) -> None:
    """A sweep ten minutes old against a one-minute limit: exit 1, saying how old."""
    exporter.last_sweep(time.time() - 600)
    result = _check("beat", "--port", str(exporter.port), "--max-age", "60")
    assert result.returncode == 1
    assert "ago" in result.stderr


def test_beat_is_unhealthy_before_its_first_sweep(exporter: Exporter) -> None:
    """The gauge at its initial 0: no sweep has finished yet."""
    exporter.last_sweep(0)
    result = _check("beat", "--port", str(exporter.port))
    assert result.returncode == 1
    assert "no sweep" in result.stderr


def test_beat_is_unhealthy_when_the_gauge_is_missing(exporter: Exporter) -> None:
    """An endpoint without the sweep gauge is not a beat."""
    result = _check("beat", "--port", str(exporter.port))
    assert result.returncode == 1
    assert "not exported" in result.stderr


def test_beat_is_unhealthy_when_nothing_listens() -> None:
    """No metrics endpoint at all: exit 1, naming the URL."""
    port = free_port()
    result = _check("beat", "--port", str(port), "--timeout", "2")
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr


class _Flower(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 200 if self.path == "/healthcheck" else 404
        body = b"OK" if status == 200 else b"no"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def flower() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flower)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_http_check_passes_on_2xx_and_fails_otherwise(flower: str) -> None:
    """`http URL`: exit 0 for a 200, exit 1 for a 404."""
    assert _check("http", f"{flower}/healthcheck").returncode == 0
    missing = _check("http", f"{flower}/nope")
    assert missing.returncode == 1
    assert "404" in missing.stderr

"""A fleet whose Redis listens on a Unix socket (``REDIS_URL=unix://...``): the worker's broker
(kombu, which has no ``unix://`` transport) and the raw turn publisher (redis-py) each get the
URL in their own spelling."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import wait_until
from workers.local.redis_server import RedisServer
from workers.queues import queue_name

pytestmark = pytest.mark.integration


def test_a_fleet_on_a_unix_socket_redis_runs_turns(harness: Harness, tmp_path: Path) -> None:
    """With REDIS_URL a ``unix://`` URL, a real worker starts (it used to die at start with
    kombu's "No such transport: unix"), takes the turn the post published straight to the
    broker list over the socket, and answers; a follow-up post is answered too."""
    with RedisServer(tmp_path / "redis", unix_socket=tmp_path / "redis.sock") as server:
        try:
            harness.configure(REDIS_URL=server.unix_url)
            harness.persona("ava", rules='[[rules]]\ntext = "over the socket"\n')
            settings = harness.settings
            assert settings.broker_url.startswith("redis+socket://")
            harness.fleet.post("ava", "hello")
            # Published over the socket before any worker runs: the message waits in the
            # broker list of the socket's Redis.
            queued = harness.fleet.client.keys(
                f"{settings.key_prefix}broker:{queue_name(settings.queue_prefix, 'interactive')}*"
            )
            assert queued
            harness.worker(queues=("interactive",))
            wait_until(
                lambda: harness.fleet.status("ava").get("last_text") == "over the socket",
                timeout=60,
                what="ava's turn over the Unix socket",
            )
            harness.fleet.post("ava", "again")
            wait_until(
                lambda: (harness.fleet.session("ava").get("turns") or 0) >= 2,
                timeout=60,
                what="ava's second turn",
            )
        finally:
            harness.stop()

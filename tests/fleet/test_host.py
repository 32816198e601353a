"""Fleet (the host API) against a real Redis: what a caller of ``run`` can rely on."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from tests.support.beat import fleet_for, settings_for, write_persona
from workers.local.redis_server import RedisServer


def test_run_rides_out_a_redis_blip_and_gets_its_reply(tmp_path: Path) -> None:
    """Redis goes away for a couple of seconds while ``run`` waits for its reply (the turn goes
    on without the caller, and its reply waits in Redis): ``run`` keeps waiting within its
    timeout and returns the reply, instead of failing on the first refused BLPOP (or the first
    read of its ``on_wait`` hook, as the CLI's reads the lane) and losing it."""
    root = tmp_path / "personas"
    write_persona(root, "ava")
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    fleet = fleet_for(settings_for(server.url, "blip:", root))
    replied = threading.Event()

    def blip_then_answer() -> None:
        nonlocal server
        time.sleep(0.5)
        assert server.process is not None
        server.process.kill()
        server.process.wait(10)
        time.sleep(2.0)
        server = RedisServer(tmp_path / "redis", port=server.port, persistent=True).start()
        [item] = fleet.client.lrange(fleet.keys.inbox("ava"), 0, -1)
        item_id = json.loads(item)["id"]
        answer = {"text": "still here", "status": "done", "turn_id": "t1"}
        fleet.client.rpush(fleet.keys.reply(item_id), json.dumps(answer))
        replied.set()

    helper = threading.Thread(target=blip_then_answer, daemon=True)
    try:
        helper.start()

        def look(_: float) -> None:  # reads Redis as the CLI's hook does: the blip hits it too
            fleet.lanes.status("ava")

        reply = fleet.run("ava", "are you there?", timeout=30, on_wait=look)
        assert replied.is_set()
        assert (reply.text, reply.status) == ("still here", "done")
    finally:
        helper.join(15)
        fleet.client.close()
        server.stop()

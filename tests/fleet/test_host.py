"""Fleet (the host API) against a real Redis: what a caller of ``run`` can rely on."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.support.beat import fleet_for, settings_for, write_persona
from workers.fleet import Fleet
from workers.fleet.errors import ItemTooLarge
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


class _Interrupted:
    """A publisher interrupted mid-publish, as a Ctrl-C in `soulfleet run` or `post` is."""

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        raise KeyboardInterrupt

    def publish_many(self, turns: object) -> None:
        raise KeyboardInterrupt


def test_a_post_interrupted_while_it_publishes_leaves_its_turn_to_the_reapers_next_pass(
    tmp_path: Path, redis_url: str
) -> None:
    """The item is in the inbox and its turn queued when the publish is interrupted: the turn
    is marked unsent, so beat's next reaper pass sends it (it waited the 600 s a lost message
    waits), and the caller was told, before the publish, that the item is kept."""
    root = tmp_path / "personas"
    write_persona(root, "ava")
    fleet = Fleet.from_settings(settings_for(redis_url, "intr:", root), publisher=_Interrupted())
    told: list[str] = []
    try:
        with pytest.raises(KeyboardInterrupt):
            fleet.post("ava", "hello", on_posted=lambda outcome: told.append(outcome.outcome))
        assert told == ["queued"]
        assert fleet.client.zscore(fleet.keys.queued, "ava") == 0.0  # unsent: the next pass
        assert fleet.lanes.status("ava")["inbox_depth"] == 1
    finally:
        fleet.client.close()


def test_a_reject_count_that_is_not_a_count_costs_no_other_gauge(
    tmp_path: Path, redis_url: str
) -> None:
    """What beat's scrape reads of the reject count: Redis's number, or 0 for a value that is
    none (every other fleet gauge of that scrape is still there)."""
    root = tmp_path / "personas"
    write_persona(root, "ava")
    fleet = Fleet.from_settings(settings_for(redis_url, "cnt:", root), publisher=_Interrupted())
    try:
        fleet.client.set(fleet.keys.inbox_rejects, "7")
        assert fleet.lane_counts()["inbox_rejects"] == 7
        fleet.client.set(fleet.keys.inbox_rejects, "garbage")
        counts = fleet.lane_counts()
        assert counts["inbox_rejects"] == 0
        assert counts["queued"] == 0
    finally:
        fleet.client.close()


class _Kept:
    """A publisher that sends nothing (the turns are not run here)."""

    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        pass

    def publish_many(self, turns: object) -> None:
        pass


def test_a_refused_post_asking_for_a_new_session_leaves_the_session_alone(
    tmp_path: Path, redis_url: str
) -> None:
    """`soulfleet run ava BIG --new-session` refused BIG (too large: exit 2, "NOT accepted")
    yet had already ended ava's conversation; an accepted one ends it."""
    root = tmp_path / "personas"
    write_persona(root, "ava")
    settings = settings_for(redis_url, "newsess:", root, SOULFLEET_ITEM_MAX_BYTES="2048")
    fleet = Fleet.from_settings(settings, publisher=_Kept())
    try:
        with pytest.raises(ItemTooLarge, match="NOT accepted"):
            fleet.post("ava", "x" * 5000, new_session=True)
        assert fleet.client.hget(fleet.keys.lane("ava"), "session_epoch") is None
        fleet.post("ava", "small", new_session=True)
        assert fleet.client.hget(fleet.keys.lane("ava"), "session_epoch") == "1"
    finally:
        fleet.client.close()

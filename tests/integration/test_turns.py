"""The fleet runtime end to end: real Redis, real `celery -A workers worker` processes.

Each test states one invariant of docs/architecture.md and checks it from what the workers
recorded (`turn.start` / `turn.end` JSON events) and from Redis, never from the code's own say-so.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import soak_seconds, wait_until
from tests.support.providers import FakeProvider, error_reply, openai_completion
from workers.fleet.errors import InboxFull
from workers.publisher import connect
from workers.settings import Settings

pytestmark = pytest.mark.integration

SLOW_HEARTBEAT = """
[[rules]]
when = { heartbeat = true }
sleep = 3
text = "HEARTBEAT_OK"

[[rules]]
text = "ok"
"""

QUICK = """
[[rules]]
sleep = 0.02
text = "ok"
"""


def _ends(harness: Harness, lane: str) -> list[dict[str, Any]]:
    return harness.events("turn.end", lane=lane)


def test_a_thousand_ticks_during_a_turn_become_one_follow_up(harness: Harness) -> None:
    """1,000 ticks fired while a turn runs fold into exactly one follow-up that reports 1,000."""
    harness.persona("ava", rules=SLOW_HEARTBEAT)
    harness.worker()
    first = harness.fleet.tick("ava")
    assert first.outcome == "queued"
    wait_until(lambda: harness.events("turn.start", lane="ava"), timeout=30, what="first turn")

    outcomes = harness.fleet.tick_lanes([("ava", "heartbeat")] * 1000)
    assert Counter(o.outcome for o in outcomes) == {"coalesced": 1000}

    wait_until(lambda: len(_ends(harness, "ava")) >= 2, timeout=60, what="follow-up turn")
    time.sleep(1.0)  # room for a wrongly queued third turn to show up
    starts = harness.events("turn.start", lane="ava")
    assert [s["ticks"] for s in starts] == [1, 1000]
    assert harness.fleet.status("ava")["state"] == "idle"


def _ticker(harness_env: dict[str, str], lanes: list[str], stop: threading.Event) -> int:
    fleet = connect(Settings.from_env(harness_env))
    sent = 0
    rng = random.Random()
    while not stop.is_set():
        fleet.tick_lanes([(rng.choice(lanes), "heartbeat") for _ in range(5)])
        sent += 5
        time.sleep(0.01)
    fleet.client.close()
    return sent


def test_hammered_lanes_never_overlap_and_consume_every_item_once(harness: Harness) -> None:
    """50 lanes, two tickers and a poster for 30 s (``SOULFLEET_TEST_SOAK``): no two turns of a
    lane overlap, and every accepted item is consumed by exactly one completed turn."""
    lanes = [f"p{i:02d}" for i in range(50)]
    for lane in lanes:
        harness.persona(lane, rules=QUICK)
    harness.worker("w1", concurrency=8)
    harness.worker("w2", concurrency=8)

    stop = threading.Event()
    posted: list[str] = []
    rejected = 0

    def poster() -> None:
        nonlocal rejected
        rng = random.Random(7)
        while not stop.is_set():
            lane = rng.choice(lanes)
            try:
                outcome = harness.fleet.post(lane, f"item for {lane}", wake=rng.random() < 0.7)
            except InboxFull:
                rejected += 1
                continue
            posted.append(outcome.item_id)
            time.sleep(0.004)

    threads = [
        threading.Thread(target=_ticker, args=(dict(harness.env), lanes, stop)),
        threading.Thread(target=_ticker, args=(dict(harness.env), lanes, stop)),
        threading.Thread(target=poster),
    ]
    for thread in threads:
        thread.start()
    time.sleep(soak_seconds(30))
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    # Items posted without a wake wait for a tick: one last tick per lane drains them.
    harness.fleet.tick_lanes([(lane, "heartbeat") for lane in lanes])

    def drained() -> bool:
        for lane in lanes:
            status = harness.fleet.status(lane)
            if status["state"] != "idle" or status["inbox_depth"] or status["pending_ticks"]:
                return False
        return True

    wait_until(drained, timeout=120, interval=0.5, what="every lane idle and drained")

    starts = harness.events("turn.start")
    ends = harness.events("turn.end")
    assert len(starts) > 200, "the hammer should have run many turns"
    assert {e["_process"] for e in ends} == {"w1", "w2"}, "both workers took turns"
    by_lane: dict[str, list[tuple[float, float]]] = defaultdict(list)
    start_at = {(s["lane"], s["turn_id"], s["fence"]): float(s["at"]) for s in starts}
    for end in ends:
        key = (end["lane"], end["turn_id"], end["fence"])
        by_lane[end["lane"]].append((start_at[key], float(end["at"])))
    assert len(start_at) == len(ends), "every started turn ended"
    for lane, intervals in by_lane.items():
        intervals.sort()
        for (_, previous_end), (next_start, _) in itertools.pairwise(intervals):
            assert next_start >= previous_end, f"two turns of {lane} overlapped"

    consumed = Counter(
        item for end in ends if end["status"] in ("done", "incomplete") for item in end["item_ids"]
    )
    assert set(consumed) == set(posted)
    assert all(count == 1 for count in consumed.values()), "an item was consumed twice"


SLOW_WHEN_TOLD = """
[[rules]]
when = { system_contains = "SLOW MODE" }
sleep = 60
text = "too slow"

[[rules]]
text = "handled"
"""


def test_a_sigkilled_worker_s_items_are_recovered_by_another(harness: Harness) -> None:
    """SIGKILL mid-turn: the drained items run first in a later turn on another worker."""
    harness.configure(SOULFLEET_LEASE_TTL="2")
    home = harness.persona("ava", rules=SLOW_WHEN_TOLD)
    (home / "SOUL.md").write_text("You are ava. SLOW MODE\n", encoding="utf-8")
    w1 = harness.worker("w1")
    first = [harness.fleet.post("ava", f"job {n}", wake=(n == 0)).item_id for n in range(3)]
    wait_until(lambda: w1.events("turn.start"), timeout=30, what="the turn on w1")
    w2 = harness.worker("w2")

    w1.kill()
    killed_at = time.time()
    (home / "SOUL.md").write_text("You are ava.\n", encoding="utf-8")  # the next turn is quick
    later = harness.fleet.post("ava", "job after the crash", wake=True).item_id

    def recovered() -> list[dict[str, Any]]:
        harness.fleet.reap()  # what beat's reaper does every few seconds
        return [e for e in w2.events("turn.end") if e["status"] == "done"]

    done = wait_until(recovered, timeout=60, interval=0.25, what="recovery on w2")
    recovery = float(done[0]["at"]) - killed_at
    print(f"\nrecovery after SIGKILL: {recovery:.2f}s (lease TTL 2s)")

    start = w2.events("turn.start")[0]
    assert start["recovered"] == 3
    assert done[0]["item_ids"][:3] == first
    assert later in [item for end in done for item in end["item_ids"]]
    assert not w1.events("turn.end"), "the killed worker committed nothing"
    assert float(start["at"]) > killed_at
    assert harness.fleet.status("ava")["state"] in ("idle", "queued", "running")


def test_a_duplicate_turn_message_is_dropped_not_run_twice(harness: Harness) -> None:
    """The same (lane, turn id) published twice runs once; the copy is dropped at start."""
    harness.persona("ava", rules=QUICK)
    harness.worker(concurrency=2)
    posted = harness.fleet.post("ava", "hello", wake=False)
    assert posted.turn_id is None
    tick = harness.fleet.tick("ava")  # publishes turn T once
    assert tick.turn_id is not None
    harness.fleet.publisher.publish("ava", tick.turn_id, "heartbeat")  # a redelivered copy

    wait_until(
        lambda: harness.events("turn.dropped", lane="ava", turn_id=tick.turn_id),
        timeout=30,
        what="the copy dropped",
    )
    wait_until(lambda: _ends(harness, "ava"), timeout=30, what="the turn")
    time.sleep(0.5)
    assert len(harness.events("turn.start", lane="ava", turn_id=tick.turn_id)) == 1
    dropped = harness.events("turn.dropped", lane="ava", turn_id=tick.turn_id)
    assert dropped[0]["reason"] in ("duplicate", "stale")

    # Long after the turn committed, another stale copy is still dropped.
    harness.fleet.publisher.publish("ava", tick.turn_id, "heartbeat")
    wait_until(
        lambda: len(harness.events("turn.dropped", lane="ava", turn_id=tick.turn_id)) == 2,
        timeout=30,
        what="the stale copy dropped",
    )
    assert len(harness.events("turn.start", lane="ava")) == 1


def test_interactive_turns_do_not_wait_behind_a_dream_batch(harness: Harness) -> None:
    """200 dream turns queued on dedicated dream workers: a post elsewhere is answered at once."""
    dream_rules = """
[[rules]]
when = { heartbeat = true }
sleep = 0.5
text = "HEARTBEAT_OK"
"""
    for n in range(200):
        harness.persona(f"d{n:03d}", rules=dream_rules, toml='[dream]\nevery = "24h"\n')
    harness.persona("talker", rules='[[rules]]\ntext = "pong"\n')
    harness.worker("dreams", queues=("dream",), concurrency=2)
    harness.worker("talk", queues=("interactive", "heartbeat"), concurrency=2)

    queued = harness.fleet.tick_lanes([(f"d{n:03d}-dreamer", "dream") for n in range(200)])
    assert Counter(o.outcome for o in queued) == {"queued": 200}
    wait_until(lambda: harness.events("turn.start", kind="dream"), timeout=30, what="dreams")

    began = time.monotonic()
    reply = harness.fleet.run("talker", "ping", timeout=30)
    answered = time.monotonic() - began
    dreams_done = len(harness.events("turn.end", kind="dream"))
    print(f"\ninteractive answer in {answered:.2f}s with {200 - dreams_done} dream turns pending")
    assert reply.text == "pong"
    assert dreams_done < 150, "the batch was still running when the answer came"
    assert answered < 15


def test_a_lane_that_always_fails_is_dead_lettered_with_its_reason(harness: Harness) -> None:
    """A persona whose files cannot be composed is a permanent failure: dead-lettered after
    its first turn (issue 10: no retry can fix a file), its status says why, posts are still
    kept, and other personas are unaffected."""
    harness.configure(SOULFLEET_MAX_ATTEMPTS="3")
    broken = harness.persona("broken", rules=QUICK)
    harness.persona("fine", rules='[[rules]]\ntext = "fine"\n')
    harness.fleet.post("broken", "hello", wake=True)
    # Broken after the post (a post to a persona whose files are invalid is refused):
    (broken / "MEMORY.md").mkdir()  # a directory where a file should be
    harness.worker(concurrency=2)

    wait_until(
        lambda: harness.fleet.status("broken")["state"] == "dead", timeout=60, what="dead-letter"
    )
    status = harness.fleet.status("broken")
    assert "MEMORY.md" in str(status["last_error"])
    assert str(status["last_error"]).startswith("permanent failure, not retried:")
    assert len(harness.events("turn.start", lane="broken")) == 1
    assert status["inflight_items"] == 1, "the item is kept for after a revive"

    (broken / "MEMORY.md").rmdir()  # fixed: the dead lane keeps posts until it is revived
    kept = harness.fleet.post("broken", "still accepted", wake=True)
    assert kept.outcome == "dead"
    assert kept.turn_id is None
    assert harness.fleet.run("fine", "are you ok?", timeout=30).text == "fine"


def test_a_turn_retried_after_a_provider_error_does_not_pay_again_for_its_answered_calls(
    harness: Harness,
) -> None:
    """A conversation turn makes two model calls: the first is answered (a tool call: paid),
    the second fails with a 500 that the call does not retry (here SOULFLEET_MODEL_RETRIES=0;
    the same happens once the retries run out, or on a 429 asking for more than 10 s). The
    lane retries the turn, which sends the same first request again: the provider must not
    be paid a second time for an answer the fleet already bought (nothing in README says a
    provider error costs the calls before it; only a worker crash mid-turn may re-run them).
    """
    with FakeProvider("openai") as provider:
        provider.enqueue(
            openai_completion(None, [("call_1", "memory", {"action": "add", "text": "tea"})]),
            error_reply("openai", 500, "upstream hiccup"),
        )
        provider.text = "Noted."
        harness.use_model_server(
            provider, SOULFLEET_RETRY_BASE="100ms", SOULFLEET_RETRY_MAX="200ms"
        )
        harness.persona("ava")
        harness.worker(queues=("interactive",))
        harness.beat()
        harness.fleet.post("ava", "remember: genmaicha")
        wait_until(
            lambda: harness.fleet.status("ava").get("last_status") == "done",
            timeout=60,
            what="the retried turn to commit",
        )
        # The first call of an attempt carries the soul and the inbox message only (the
        # retry's soul may differ: the failed attempt's memory write is on disk by then).
        inbox = provider.bodies[0]["messages"][-1]
        paid_for_first = [
            served
            for served in provider.served
            if len(served.body["messages"]) == 2 and served.body["messages"][-1] == inbox
        ]
        assert len(paid_for_first) == 1, (
            f"the turn's first call was paid {len(paid_for_first)} times "
            f"({len(provider.served)} answers billed for one turn of two calls)"
        )

"""beat end to end: real `celery -A workers beat` and worker processes on a real Redis.

Every check reads what the processes recorded (JSON log lines, Redis, the metrics endpoint);
nothing is faked except the model, which is the built-in scripted one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import socket
import time
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.support.beat import write_persona
from tests.support.fleet import (
    FleetProcess,
    fleet_env,
    soak_seconds,
    start_beat,
    start_worker,
    stop_all,
    wait_until,
)
from workers import metrics
from workers.fleet.keys import Keys

pytestmark = pytest.mark.integration

EVERY_1S = '[heartbeat]\nevery = "1s"\n'
FAST = {
    "SOULFLEET_SWEEP_INTERVAL": "0.2",
    "SOULFLEET_SYNC_INTERVAL": "0.5",
}


@pytest.fixture
def env(
    redis_url: str, key_prefix: str, persona_root: Path, redis_client: redis.Redis
) -> dict[str, str]:
    """The environment of this test's fleet processes (keys cleaned by ``redis_client``)."""
    return fleet_env(redis_url=redis_url, key_prefix=key_prefix, personas=persona_root, extra=FAST)


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path / "logs"


def ticks(process: FleetProcess, lane: str | None = None) -> list[dict[str, Any]]:
    """tick.emitted and tick.coalesced events of one beat, optionally for one lane."""
    found = process.events("tick.emitted") + process.events("tick.coalesced")
    return [event for event in found if lane is None or event["lane"] == lane]


def off_grid(dues: list[int], every_ms: int) -> list[int]:
    """Gaps between consecutive due times that are not a whole number of intervals.

    Due times are grid slots plus a jitter under 10% of the interval, so a gap is k intervals
    (k >= 1; k > 1 only if a loaded machine made beat skip a slot) within that jitter. A double
    tick shows up as a repeated due time, a second schedule as off-grid gaps.
    """
    gaps = [later - earlier for earlier, later in itertools.pairwise(sorted(dues))]
    return [
        gap
        for gap in gaps
        if round(gap / every_ms) < 1 or abs(gap - round(gap / every_ms) * every_ms) >= every_ms / 10
    ]


def turn_ends(worker: FleetProcess, lane: str) -> list[dict[str, Any]]:
    return [e for e in worker.events("turn.end") if e.get("lane") == lane]


def test_personas_with_every_1s_beat_through_real_workers(
    env: dict[str, str], logs: Path, persona_root: Path, processes: list[FleetProcess]
) -> None:
    """Two personas with every = "1s" each get a heartbeat turn about every second."""
    for name in ("ava", "bob"):
        write_persona(persona_root, name, EVERY_1S)
    processes.append(start_worker(env, logs))
    processes.append(beat := start_beat(env, logs))
    worker = processes[0]
    wait_until(
        lambda: all(len(turn_ends(worker, lane)) >= 4 for lane in ("ava", "bob")),
        timeout=60,
        what="four heartbeat turns for each persona",
    )
    for lane in ("ava", "bob"):
        dues = [event["due"] for event in ticks(beat, lane)]
        assert len(dues) >= 4, lane
        assert off_grid(dues, 1000) == [], lane
        assert all(e["kind"] == "heartbeat" for e in turn_ends(worker, lane))


def test_directory_changes_apply_without_restart(
    env: dict[str, str], logs: Path, persona_root: Path, processes: list[FleetProcess]
) -> None:
    """A persona added while beat runs starts beating, a removed one stops, and a changed
    interval takes effect — all without restarting beat."""
    ava = write_persona(persona_root, "ava", EVERY_1S)
    write_persona(persona_root, "bob", EVERY_1S)
    processes.append(beat := start_beat(env, logs))
    wait_until(lambda: len(ticks(beat, "bob")) >= 2, timeout=30, what="bob beating")

    write_persona(persona_root, "cyd", EVERY_1S)
    wait_until(lambda: len(ticks(beat, "cyd")) >= 2, timeout=30, what="new persona cyd beating")

    shutil.rmtree(persona_root / "bob")
    removed = beat.wait_for_event("registry.removed", timeout=30)
    assert removed["persona"] == "bob"
    bob_before = len(ticks(beat, "bob"))
    cyd_before = len(ticks(beat, "cyd"))
    wait_until(lambda: len(ticks(beat, "cyd")) >= cyd_before + 3, timeout=30, what="cyd ticks")
    assert len(ticks(beat, "bob")) == bob_before

    (ava / "persona.toml").write_text('[heartbeat]\nevery = "3s"\n', encoding="utf-8")
    updated = beat.wait_for_event("schedule.updated", timeout=30)
    assert (updated["lane"], updated["every"]) == ("ava", 3.0)
    wait_until(
        lambda: len([e for e in ticks(beat, "ava") if e["due"] >= updated["first_due"]]) >= 3,
        timeout=30,
        what="three ava ticks on the new interval",
    )
    after = [e["due"] for e in ticks(beat, "ava") if e["due"] >= updated["first_due"]]
    assert off_grid(after, 3000) == [], after


def _free_ports(count: int) -> list[int]:
    """``count`` DISTINCT free ports: every socket stays bound until all are chosen (asking
    for one free port at a time can hand the same port out twice)."""
    with contextlib.ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]


def test_a_bad_persona_toml_is_reported_and_the_others_keep_beating(
    *,
    env: dict[str, str],
    logs: Path,
    persona_root: Path,
    processes: list[FleetProcess],
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    """An invalid persona.toml is logged and recorded; the valid persona beats on; fixing the
    file schedules the broken one without a restart."""
    write_persona(persona_root, "ava", EVERY_1S)
    bad = write_persona(persona_root, "bad", '[heartbeat]\nevery = "often"\n')
    processes.append(beat := start_beat(env, logs))
    invalid = beat.wait_for_event("registry.invalid", timeout=30)
    assert (invalid["persona"], invalid["key"]) == ("bad", "heartbeat.every")
    wait_until(lambda: len(ticks(beat, "ava")) >= 3, timeout=30, what="ava beating regardless")
    assert ticks(beat, "bad") == []
    record = json.loads(str(redis_client.hget(Keys(key_prefix).registry, "bad")))
    assert "heartbeat.every" in record["error"]

    (bad / "persona.toml").write_text(EVERY_1S, encoding="utf-8")
    wait_until(lambda: len(ticks(beat, "bad")) >= 1, timeout=30, what="bad beating once fixed")


def test_two_beats_for_20s_tick_each_lane_on_one_schedule(
    env: dict[str, str], logs: Path, persona_root: Path, processes: list[FleetProcess]
) -> None:
    """Two beat processes on one Redis for 20 s (``SOULFLEET_TEST_SOAK``): no due slot is ticked
    twice, and each lane's ticks follow one 1-second schedule."""
    window = soak_seconds(20)
    lanes = [f"p{i}" for i in range(6)]
    for lane in lanes:
        write_persona(persona_root, lane, EVERY_1S)
    processes.append(start_worker(env, logs))
    processes.append(first := start_beat(env, logs, name="beat1"))
    processes.append(second := start_beat(env, logs, name="beat2"))
    end = time.monotonic() + window
    wait_until(lambda: time.monotonic() >= end, timeout=window + 10, what="the two-beat window")
    stop_all(processes[1:])

    per_lane: dict[str, list[int]] = defaultdict(list)
    by_beat = {first.name: 0, second.name: 0}
    for process in (first, second):
        for event in ticks(process):
            per_lane[event["lane"]].append(event["due"])
            by_beat[process.name] += 1
            assert event["at"] >= event["due"]
    assert all(by_beat.values()), f"both beats must have swept: {by_beat}"
    for lane in lanes:
        dues = per_lane[lane]
        assert len(dues) == len(set(dues)), f"{lane} ticked a slot twice"
        assert off_grid(dues, 1000) == [], lane
        # One 1-second schedule: slots at least 0.9 s apart (jitter is under 10%) over the span
        # the ticks cover, where two schedules would give about twice as many; and most of the
        # slots of the window really ticked. The span, not the window, bounds the count: beat1
        # was already sweeping while beat2 started, and both sweep until they are stopped.
        span = (max(dues) - min(dues)) / 1000
        assert window / 2 <= len(dues) <= span / 0.9 + 1, (lane, len(dues), span)


def test_the_reaper_recovers_a_lane_whose_queued_message_was_deleted(
    *,
    env: dict[str, str],
    logs: Path,
    persona_root: Path,
    processes: list[FleetProcess],
    redis_client: redis.Redis,
    key_prefix: str,
) -> None:
    """A turn message deleted from the broker is re-published by beat's reaper and then runs."""
    write_persona(persona_root, "ava", '[heartbeat]\nevery = "1h"\n')
    reaping = {**env, "SOULFLEET_REAP_INTERVAL": "0.5", "SOULFLEET_REAP_QUEUED_AFTER": "3"}
    keys = Keys(key_prefix)
    queue = f"{key_prefix}broker:{env['SOULFLEET_QUEUE_PREFIX']}.heartbeat"
    processes.append(beat := start_beat(reaping, logs))
    # No worker yet: force ava due now, so its turn message waits in the broker.
    redis_client.zadd(keys.schedule, {"ava|heartbeat": 0})
    emitted = beat.wait_for_event("tick.emitted", timeout=30)
    assert emitted["lane"] == "ava"
    wait_until(lambda: redis_client.llen(queue) == 1, timeout=10, what="the turn message")
    turn_id = redis_client.hget(keys.lane("ava"), "turn_id")
    assert redis_client.delete(queue) == 1  # the broker lost it

    repaired = beat.wait_for_event("reaper.repaired", timeout=30)
    assert (repaired["lane"], repaired["reason"], repaired["turn_id"]) == (
        "ava",
        "queued_too_long",
        turn_id,
    )
    assert redis_client.llen(queue) == 1
    processes.append(worker := start_worker(reaping, logs))
    wait_until(lambda: turn_ends(worker, "ava"), timeout=60, what="the recovered turn")
    assert turn_ends(worker, "ava")[0]["turn_id"] == turn_id


def _scrape(port: int) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    families: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return families


def _value(
    families: dict[str, list[tuple[str, dict[str, str], float]]], sample: str, **labels: str
) -> float:
    for samples in families.values():
        for name, have, value in samples:
            if name == sample and all(have.get(k) == v for k, v in labels.items()):
                return value
    raise AssertionError(f"no sample {sample} {labels}")


def test_a_scrape_after_a_short_run_shows_every_metric(
    env: dict[str, str], logs: Path, persona_root: Path, processes: list[FleetProcess]
) -> None:
    """beat's and a worker's /metrics together name every metric in workers/metrics.py, with
    values that match what the short run did."""
    write_persona(persona_root, "ava", EVERY_1S)
    write_persona(persona_root, "mute", EVERY_1S, heartbeat="")
    asleep = (datetime.now(UTC) + timedelta(hours=3)).strftime("%H:00")
    awake = (datetime.now(UTC) + timedelta(hours=4)).strftime("%H:00")
    write_persona(
        persona_root,
        "owl",
        f'[heartbeat]\nevery = "1s"\n'
        f'active_hours = {{ start = "{asleep}", end = "{awake}", timezone = "UTC" }}\n',
    )
    write_persona(persona_root, "bad", '[heartbeat]\nevery = "often"\n')
    beat_port, worker_port = _free_ports(2)
    worker = start_worker({**env, "SOULFLEET_METRICS_PORT": str(worker_port)}, logs)
    processes.append(worker)
    processes.append(beat := start_beat({**env, "SOULFLEET_METRICS_PORT": str(beat_port)}, logs))
    wait_until(lambda: len(turn_ends(worker, "ava")) >= 3, timeout=60, what="three ava turns")
    wait_until(
        lambda: (
            {"blank_heartbeat", "quiet_hours"} <= {e["reason"] for e in beat.events("tick.skipped")}
        ),
        timeout=30,
        what="both kinds of skip",
    )
    from_beat, from_worker = _scrape(beat_port), _scrape(worker_port)

    expected = set()
    for name in metrics.__all__:
        obj = getattr(metrics, name)
        if isinstance(obj, str):
            expected.add(obj)
        elif hasattr(obj, "_name"):
            expected.add(obj._name)
    assert expected <= set(from_beat) | set(from_worker)

    assert _value(from_beat, "soulfleet_ticks_total", kind="heartbeat", outcome="emitted") >= 3
    assert _value(from_beat, "soulfleet_ticks_skipped_total", reason="blank_heartbeat") >= 1
    assert _value(from_beat, "soulfleet_ticks_skipped_total", reason="quiet_hours") >= 1
    assert _value(from_beat, "soulfleet_sweep_seconds_count") >= 3
    assert _value(from_beat, "soulfleet_sweep_seconds_sum") < _value(
        from_beat, "soulfleet_sweep_seconds_count"
    )  # well under a second per sweep
    assert abs(_value(from_beat, "soulfleet_last_sweep_timestamp_seconds") - time.time()) < 10
    assert _value(from_beat, "soulfleet_sweep_due") >= 0
    assert _value(from_beat, "soulfleet_registry_invalid_personas") == 1
    assert _value(from_beat, "soulfleet_dead_lettered_lanes") == 0
    states = ("idle", "queued", "running")
    lanes = sum(_value(from_beat, "soulfleet_lanes", state=state) for state in states)
    assert lanes == 4  # ava, mute, owl, bad: one lane each, none dead
    assert _value(from_worker, "soulfleet_turns_total", kind="heartbeat", status="done") >= 3
    assert _value(from_worker, "soulfleet_beats_total", outcome="silent") >= 3
    assert _value(from_worker, "soulfleet_turn_seconds_count", kind="heartbeat") >= 3
    assert _value(from_worker, "soulfleet_model_call_seconds_count", provider="scripted") >= 3
    assert _value(from_worker, "soulfleet_lease_losses_total") == 0
    assert _value(from_beat, "soulfleet_inbox_rejects_total") == 0

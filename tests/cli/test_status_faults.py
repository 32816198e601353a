"""`soulfleet status` under faults: what it tells an operator must be true and say what to do.

Each test reproduces a fault seen on a real fleet (workers, beat, a fake provider) and checks
the line an operator reads for it, on a real Redis.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from pathlib import Path

import redis

from tests.cli.conftest import Invoke
from tests.support.cli import lanes_for
from workers.cli.status import breaker_lines
from workers.fleet import Fleet
from workers.fleet.breaker import BreakerState
from workers.fleet.keys import Keys
from workers.local.redis_server import RedisServer
from workers.metrics import LaneStateCollector
from workers.persona.errors import ModelAuthError, ModelServerError
from workers.persona.inbox import InboxItem
from workers.settings import Settings


class _NoPublisher:
    def publish(self, lane: str, turn_id: str, kind: str) -> None:
        raise AssertionError("nothing is published here")

    def publish_many(self, turns: object) -> None:
        raise AssertionError("nothing is published here")


def _fleet(env: Mapping[str, str | None]) -> Fleet:
    settings = Settings.from_env({k: v for k, v in env.items() if v is not None})
    return Fleet(settings, publisher=_NoPublisher())


def test_status_says_when_redis_may_evict_the_fleets_keys(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """`CONFIG SET maxmemory-policy allkeys-lru` on a running fleet: Redis silently evicts lane
    hashes, fences, leases and inbox items (a real fleet lost ~8,000 keys in 15 s). beat logs
    `redis.evicting_policy` at each sync, but `status` showed every lane idle and beat sweeping
    (used memory never reaches maxmemory under LRU, so no FULL line either): the fleet
    looked healthy while losing its state. `status` reads INFO memory already; it must name
    the policy and the fix, and --json must carry it."""
    with RedisServer(tmp_path / "redis") as server:
        own = {**env, "REDIS_URL": server.url}
        client = redis.Redis.from_url(server.url)
        try:
            assert "maxmemory-policy" not in invoke("status", environ=own).stdout
            client.config_set("maxmemory-policy", "allkeys-lru")
            result = invoke("status", environ=own)
            assert result.exit_code == 0, result.output
            [line] = [ln for ln in result.stdout.splitlines() if "maxmemory-policy" in ln]
            assert "allkeys-lru" in line
            assert "CONFIG SET maxmemory-policy noeviction" in line
            payload = json.loads(invoke("status", "--json", environ=own).stdout)
            assert payload["redis_memory"]["policy"] == "allkeys-lru"
        finally:
            client.config_set("maxmemory-policy", "noeviction")
            client.close()


def test_status_and_metrics_count_the_keys_redis_evicted(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """Keys evicted under an evicting policy were counted nowhere: status then read a lost
    marker as "a restart ... FLUSHALL" though Redis never restarted. Evicted keys are said
    (with the fix), carried in --json, exported as a counter, and a lost-data line under an
    evicting policy names eviction as a cause."""
    with RedisServer(tmp_path / "redis") as server:
        own = {**env, "REDIS_URL": server.url}
        client = redis.Redis.from_url(server.url)
        try:
            assert "EVICTED" not in invoke("status", environ=own).stdout
            client.config_set("maxmemory-policy", "allkeys-lru")
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", used + 200_000)
            for n in range(400):
                client.set(f"filler:{n}", "x" * 4096)
            evicted = int(client.info("stats")["evicted_keys"])
            assert evicted > 0
            result = invoke("status", environ=own)
            [line] = [ln for ln in result.stdout.splitlines() if "EVICTED" in ln]
            assert "keys EVICTED since it started (maxmemory-policy allkeys-lru now)" in line
            assert "CONFIG SET maxmemory-policy noeviction" in line
            payload = json.loads(invoke("status", "--json", environ=own).stdout)
            assert payload["redis_memory"]["evicted_keys"] >= evicted
            counts = _fleet(own).lane_counts()
            assert counts["redis_evicted_keys"] >= evicted
            samples = {sample.name: sample.value for family in LaneStateCollector(
                lambda: counts).collect() for sample in family.samples}  # fmt: skip
            assert samples["soulfleet_redis_evicted_keys_total"] >= evicted
            keys = Keys(own["SOULFLEET_KEY_PREFIX"] or "soulfleet:")
            client.set(keys.redis_data_lost, json.dumps({"at": time.time(), "personas": 3}))
            lost = [ln for ln in invoke("status", environ=own).stdout.splitlines()
                    if "lost its data" in ln]  # fmt: skip
            assert "FLUSHALL, or eviction)" in lost[0]
            # the runbook's fix applied: eviction is still named (it happened), and the line
            # no longer tells the operator to do what is done
            client.config_set("maxmemory-policy", "noeviction")
            out = invoke("status", environ=own).stdout
            assert "FLUSHALL, or eviction)" in out
            [line] = [ln for ln in out.splitlines() if "EVICTED" in ln]
            assert "the policy is noeviction now" in line
            assert "CONFIG SET maxmemory-policy noeviction" not in line
        finally:
            client.config_set("maxmemory", 0)
            client.config_set("maxmemory-policy", "noeviction")
            client.close()


def test_an_open_breaker_whose_probes_are_refused_the_key_does_not_promise_to_resume(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """The provider went down (the breaker opened on 5xx), then came back refusing the key
    (HTTP 401: a key revoked or rotated meanwhile). A 401 never closes the breaker, so it
    stays OPEN for good and each probe dead-letters one deferred lane (on a real fleet: one
    every probe interval, 97 lanes waiting their turn to die). `status` still said "(they
    resume by themselves)", and the runbook's advice for an open breaker is to wait. The line
    must say the lanes will not resume until the key is fixed, and point at the runbook."""
    fleet = _fleet(env)
    for _ in range(fleet.settings.breaker_min_calls):
        fleet.breaker.record_failure("openai", ModelServerError("openai: HTTP 500"))
    assert "(they resume by themselves)" in invoke("status").stdout  # a real outage: true
    refused = ModelAuthError(
        "openai: authentication refused (HTTP 401): Incorrect API key provided; check "
        "OPENAI_API_KEY"
    )
    fleet.breaker.record_failure("openai", refused, probe=True)
    [line] = [ln for ln in invoke("status").stdout.splitlines() if ln.startswith("breaker ")]
    assert "OPEN" in line
    assert "resume by themselves" not in line, line
    assert "Rotating a model key" in line, line


def test_a_queued_row_says_how_long_the_lane_has_waited(
    invoke: Invoke, env: Mapping[str, str | None]
) -> None:
    """A turn message the worker took while Redis went down (turn.claim_failed, then acked) or
    refused as Redis filled leaves its lane `queued` until the reaper re-publishes it after
    SOULFLEET_REAP_QUEUED_AFTER (600 s); its heartbeats pile up as pending ticks meanwhile.
    The runbook says `status --state queued` lists such lanes, but a row read `queued` alike
    after 1 s and after 8 minutes (a running lane reads `running for Ns`, a queued dreamer
    `queued for Ns`): nothing told a stranded lane from one about to run."""
    lanes = lanes_for(env)
    item = InboxItem(text="hi", sender="external", channel="api", id="i1", at=1.0)
    assert lanes.post("ava", item, wake=True).turn_id is not None
    # Queued 500 s ago, as the lane stranded by a Redis outage was when first seen.
    lanes.client.hset(lanes.keys.lane("ava"), "queued_at", int((time.time() - 500) * 1000))
    row = next(ln for ln in invoke("status").stdout.splitlines() if ln.startswith("ava "))
    assert row.split()[1:4] == ["queued", "for", "8m"], row
    out = invoke("status", "ava").stdout
    one = out.splitlines()[1]
    assert one.split()[1:4] == ["queued", "for", "8m"], one
    # ... and why it may wait, and when the reaper sends its turn again (600 s by default)
    assert re.search(r"queued: lane ava has waited 50\ds for a worker to take its turn", out)
    assert "or its turn message was lost" in out
    assert re.search(r"SOULFLEET_REAP_QUEUED_AFTER \(600s\), in about (100|9\d)s", out)
    lanes.client.hset(lanes.keys.lane("ava"), "queued_at", int((time.time() - 5) * 1000))
    assert "queued: lane" not in invoke("status", "ava").stdout  # seconds: nothing to say


def test_status_of_a_large_fleet_does_not_cost_round_trips_per_persona(
    invoke: Invoke, env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """`status` (and `status --state dead`, "the rows that matter in a fleet of thousands")
    read each persona with three round trips of its own (its lane, its dreamer lane, its
    tokens today): 3,300 personas took 7.5 s and ~37,000 commands on a real fleet, growing
    linearly (100,000 personas: minutes, for a filter that keeps a handful of rows). Redis's
    ``total_reads_processed`` counts the requests it read: it must not grow with the fleet."""
    root = tmp_path / "big"
    root.mkdir()
    for index in range(200):
        home = root / f"p{index:03d}"
        home.mkdir()
        (home / "SOUL.md").write_text("You are a test persona.\n")
    with RedisServer(tmp_path / "redis") as server:
        own = {**env, "REDIS_URL": server.url, "SOULFLEET_PERSONAS": str(root)}
        client = redis.Redis.from_url(server.url)
        try:

            def reads() -> int:
                return int(client.info("stats")["total_reads_processed"])

            before = reads()
            result = invoke("status", "--state", "dead", environ=own)
            spent = reads() - before - 1  # less this client's own INFO
            assert result.exit_code == 0, result.output
            assert "no personas in state dead" in result.stdout
            assert spent < 50, f"{spent} requests read by Redis for one status of 200 personas"
        finally:
            client.close()


def test_a_long_breaker_error_is_cut_at_a_word_and_says_so() -> None:
    """A provider error longer than the line allows is cut at a whole word with an ellipsis
    (it was cut at 120 characters, mid-parenthesis: "Connection refused (after 4")."""
    error = "model call failed (ModelUnreachable): openai: cannot connect to " + (
        "http://127.0.0.1:1/chat/completions: [Errno 111] Connection refused (after 4 tries) " * 3
    )
    state = BreakerState("openai", True, 0.0, 10.0, 5, 10, 10, 1, error)
    [line] = breaker_lines([state], now=5.0)
    shown = line.split("last error: ", 1)[1]
    assert shown.endswith(" …")
    assert error.startswith(shown[:-2])
    assert not shown[:-2].endswith(" ")
    short = BreakerState("openai", True, 0.0, 10.0, 5, 10, 10, 1, "HTTP 500 (after 4 tries)")
    assert breaker_lines([short], now=5.0)[0].endswith("last error: HTTP 500 (after 4 tries)")


def test_an_open_breaker_counts_its_deferred_lanes_lost_from_their_index() -> None:
    """The breaker's deferred index evicted: its line said "0 lane(s) deferred (they resume by
    themselves)" beside the line naming those lanes lost; no probe finds one to run until they
    are put back, and the breaker line says so."""
    state = BreakerState("openai", True, 0.0, 10.0, 0, 10, 5, 1, "HTTP 500")
    [line] = breaker_lines([state], now=5.0, lost={"openai": 7})
    assert "0 lane(s) deferred (they resume by themselves; and 7 more lost from the deferred" in (
        line
    )
    assert "resume only once `soulfleet revive --all` puts them back" in line
    [plain] = breaker_lines([state], now=5.0, lost={"anthropic": 2})
    assert "resume by themselves" in plain

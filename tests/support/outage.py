"""A model provider outage against a real fleet, shared by the integration test and the bench.

Real processes throughout: ``celery -A workers worker`` and ``celery -A workers beat`` on a real
Redis, personas whose ``persona.toml`` says ``model = "openai:fake"``, and a
:class:`~tests.support.providers.FakeProvider` speaking the OpenAI protocol. While a poster
thread keeps posting to random personas, the provider goes through four phases:

1. healthy for ``warm`` seconds;
2. HTTP 500 to every request for ``failing`` seconds;
3. gone (its port closed: connection refused) for ``refusing`` seconds;
4. back (a new server on the same port). Posting stops here, and the clock runs until every
   posted item has been consumed by a turn that ended ``done``, and no lane is queued, running,
   waiting out a retry or deferred.

What is measured comes from Redis (lane counts, the breaker's call counters) and from the
workers' ``turn.end`` log lines (which items each done turn consumed), never from the code's
own say-so.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.fleet import FleetProcess, read_events, start_beat, start_worker
from tests.support.providers import FakeProvider, error_reply
from workers.local.redis_server import free_port
from workers.publisher import connect
from workers.settings import Settings

__all__ = ["OutageResult", "outage_env", "run_outage", "write_personas"]


def outage_env(port: int) -> dict[str, str]:
    """Fleet settings for the scenario: one try per model call (the breaker, not HTTP
    retries, is under test), quick backoff and breaker timings so a run takes a minute."""
    return {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "OPENAI_API_KEY": "sk-outage-test",
        "SOULFLEET_MODEL_RETRIES": "0",
        "SOULFLEET_MODEL_TIMEOUT": "5",
        "SOULFLEET_RETRY_BASE": "0.5s",
        "SOULFLEET_RETRY_MAX": "4s",
        "SOULFLEET_BREAKER_MIN_CALLS": "5",
        "SOULFLEET_BREAKER_WINDOW": "10s",
        "SOULFLEET_BREAKER_PROBE_INTERVAL": "2s",
        "SOULFLEET_RECOVER_INTERVAL": "0.5",
        "SOULFLEET_SYNC_INTERVAL": "5",
    }


def write_personas(root: Path, count: int) -> list[str]:
    names = [f"p{i:03d}" for i in range(count)]
    for name in names:
        home = root / name
        home.mkdir(parents=True, exist_ok=True)
        (home / "SOUL.md").write_text(f"You are {name}.\n", encoding="utf-8")
        (home / "persona.toml").write_text('model = "openai:fake"\n', encoding="utf-8")
    return names


@dataclass
class OutageResult:
    personas: int
    posted: int = 0
    posted_during_outage: int = 0
    outage_seconds: float = 0.0
    calls_during_outage: int = 0
    http_500s: int = 0
    breaker_opened_after: float | None = None
    dead_lanes: int = 0
    max_deferred: int = 0
    max_retrying: int = 0
    drain_seconds: float | None = None
    unprocessed: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        drained = "not drained" if self.drain_seconds is None else f"{self.drain_seconds:.1f} s"
        opened = (
            "never" if self.breaker_opened_after is None else f"{self.breaker_opened_after:.1f} s"
        )
        return [
            f"personas                         {self.personas}",
            f"items posted (during outage)     {self.posted} ({self.posted_during_outage})",
            f"outage (500 then refused)        {self.outage_seconds:.0f} s",
            f"model calls during the outage    {self.calls_during_outage}"
            f" ({self.http_500s} answered 500)",
            f"breaker opened after             {opened}",
            f"most lanes deferred / retrying   {self.max_deferred} / {self.max_retrying}",
            f"lanes dead-lettered              {self.dead_lanes}",
            f"items not processed              {len(self.unprocessed)}",
            f"recovery -> backlog drained      {drained}",
        ]


def _done_items(logs: Path) -> set[str]:
    done: set[str] = set()
    for path in logs.glob("*.log"):
        for record in read_events(path, "turn.end"):
            if record.get("status") == "done":
                done.update(str(item) for item in record.get("item_ids") or [])
    return done


def run_outage(
    env: dict[str, str],
    root: Path,
    logs: Path,
    *,
    personas: int,
    warm: float,
    failing: float,
    refusing: float,
    post_every: float,
    workers: int = 1,
    concurrency: int = 16,
    drain_timeout: float = 180.0,
    say: Callable[[str], None] = lambda _: None,
    processes: list[FleetProcess] | None = None,
) -> OutageResult:
    """Run the four phases (module docstring) and return what was measured."""
    port = free_port()
    env = {**env, **outage_env(port)}
    names = write_personas(root, personas)
    started: list[FleetProcess] = processes if processes is not None else []
    result = OutageResult(personas=personas)
    provider = FakeProvider("openai", port=port, text="ok").start()
    fleet = connect(Settings.from_env(env))
    keys = fleet.keys
    stop = threading.Event()
    posted: list[tuple[str, float]] = []
    outage: list[float] = []

    def poster() -> None:
        rng = random.Random(10)
        while not stop.is_set():
            outcome = fleet.post(rng.choice(names), "hello", sender="bench", wake=True)
            posted.append((outcome.item_id, time.monotonic()))
            stop.wait(post_every)

    def calls() -> int:
        return int(fleet.client.hget(keys.breaker("openai"), "calls_total") or 0)

    thread = threading.Thread(target=poster, name="outage-poster", daemon=True)
    try:
        for index in range(workers):
            started.append(start_worker(env, logs, name=f"w{index + 1}", concurrency=concurrency))
        started.append(start_beat(env, logs))
        thread.start()
        say(f"healthy for {warm:.0f} s ...")
        time.sleep(warm)

        say(f"HTTP 500 for {failing:.0f} s ...")
        before_calls, before_requests = calls(), len(provider.requests)
        began = time.monotonic()
        outage.append(began)
        provider.enqueue(*[error_reply("openai", 500, "overloaded")] * 1_000_000)

        def watch(until: float) -> None:
            while time.monotonic() < until:
                waiting = fleet.lanes.waiting()
                result.max_deferred = max(result.max_deferred, waiting["deferred"])
                result.max_retrying = max(result.max_retrying, waiting["retry"])
                if result.breaker_opened_after is None and fleet.breaker.is_open("openai"):
                    result.breaker_opened_after = time.monotonic() - began
                time.sleep(0.2)

        watch(began + failing)
        result.http_500s = len(provider.requests) - before_requests
        say(f"connection refused for {refusing:.0f} s ...")
        provider.stop()
        watch(time.monotonic() + refusing)

        provider = FakeProvider("openai", port=port, text="ok").start()
        recovered = time.monotonic()
        result.outage_seconds = recovered - began
        stop.set()
        thread.join(timeout=10)
        result.calls_during_outage = calls() - before_calls
        result.posted = len(posted)
        result.posted_during_outage = sum(1 for _, at in posted if began <= at < recovered)
        say("provider back; draining ...")

        wanted = {item for item, _ in posted}
        deadline = recovered + drain_timeout
        while time.monotonic() < deadline:
            counts, waiting = fleet.lanes.counts(), fleet.lanes.waiting()
            quiet = counts["queued"] + counts["running"] + waiting["retry"] + waiting["deferred"]
            if quiet == 0 and wanted <= _done_items(logs):
                result.drain_seconds = time.monotonic() - recovered
                break
            time.sleep(0.5)
        result.dead_lanes = fleet.lanes.counts()["dead"]
        result.unprocessed = sorted(wanted - _done_items(logs))
        return result
    finally:
        stop.set()
        provider.stop()
        if processes is None:
            for process in started:
                process.stop()
        fleet.client.close()

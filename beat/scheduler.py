"""FleetScheduler: the beat scheduler that runs the fleet's clock (``celery -A workers beat``).

Why a :class:`celery.beat.Scheduler` subclass with three in-process entries, and not one beat
entry per persona: beat publishes its entries serially and keeps them in memory, so 10,000
persona entries take minutes per pass and one slow publish delays everyone. Here the per-persona
schedule lives in Redis (:mod:`beat.sync`, :mod:`beat.sweep`) and beat itself only knows:

- ``soulfleet.sweep`` every ``SOULFLEET_SWEEP_INTERVAL``: claim and tick what is due;
- ``soulfleet.sync`` every ``SOULFLEET_SYNC_INTERVAL``: personas root -> schedule (also once at
  start, so a fresh beat schedules the fleet before its first sweep);
- ``soulfleet.reap`` every ``SOULFLEET_REAP_INTERVAL``: re-queue stranded lanes;
- ``soulfleet.recover`` every ``SOULFLEET_RECOVER_INTERVAL``: release retries whose backoff is
  over, lanes whose claiming worker died, lanes a closed provider breaker deferred.

Every schedule decision uses the Redis server's clock
(:class:`workers.fleet.servertime.ServerClock`), not this host's: a beat whose clock is off
never re-ticks a slot another beat ticked.

These three RUN IN THIS PROCESS instead of being published as tasks: if they went through a
worker queue, a dreaming batch or saturated workers would delay every persona's heartbeat, and
a fleet with no idle worker would never reap itself. Any other entry in ``app.conf.beat_schedule``
is published as usual. It is not a PersistentScheduler: there is no shelve file in the working
directory; all state is in Redis, which is why several beats may run at once (claims are atomic).

An exception in one pass is logged and the next pass runs: beat never dies of a bad sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import structlog
from celery.beat import ScheduleEntry, Scheduler

from beat.reaper import Reaper
from beat.recover import Recoverer
from beat.sweep import Sweeper
from beat.sync import RegistrySync
from workers import metrics
from workers.fleet import Fleet
from workers.fleet.errors import EvictingRedis, RedisFull, as_redis_refusal
from workers.fleet.eviction import check_eviction_policy, refuse_to_start_on_eviction
from workers.publisher import CeleryPublisher
from workers.settings import Settings

__all__ = ["IN_PROCESS", "REAP", "RECOVER", "SWEEP", "SYNC", "FleetScheduler"]

_log = structlog.get_logger("soulfleet.beat")

SWEEP = "soulfleet.sweep"
SYNC = "soulfleet.sync"
REAP = "soulfleet.reap"
RECOVER = "soulfleet.recover"
IN_PROCESS = (SWEEP, SYNC, REAP, RECOVER)

# The lane-state collector is registered once per process, however many schedulers exist.
_collectors: list[metrics.LaneStateCollector] = []


class FleetScheduler(Scheduler):
    """Celery beat scheduler whose sweep, sync and reap entries run in-process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._settings: Settings | None = None
        self._fleet: Fleet | None = None
        self._sync: RegistrySync | None = None
        self._sweeper: Sweeper | None = None
        self._reaper: Reaper | None = None
        self._recoverer: Recoverer | None = None
        super().__init__(*args, **kwargs)

    # -- the fleet, built lazily: `celery beat` also instantiates us (lazy) for its banner ----
    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings

    @property
    def fleet(self) -> Fleet:
        if self._fleet is None:
            # Publish through the app `celery -A` loaded (or a test's), built from our settings.
            publisher = CeleryPublisher(self.settings, self.app)
            self._fleet = Fleet.from_settings(self.settings, publisher=publisher, server_clock=True)
        return self._fleet

    def _registry_sync(self) -> RegistrySync:
        if self._sync is None:
            fleet = self.fleet
            self._sync = RegistrySync(
                client=fleet.client,
                keys=fleet.keys,
                registry=fleet.registry,
                settings=fleet.settings,
                clock=fleet.clock,
            )
        return self._sync

    def _sweep(self) -> None:
        if self._sweeper is None:
            self._sweeper = Sweeper(self.fleet)
        self._sweeper.run()

    def _reap(self) -> None:
        if self._reaper is None:
            self._reaper = Reaper(self.fleet)
        self._reaper.run()

    def _recover(self) -> None:
        if self._recoverer is None:
            self._recoverer = Recoverer(self.fleet)
        self._recoverer.run()

    def _run_sync(self) -> None:
        self._registry_sync().run()
        # The policy was checked at start; a CONFIG SET since then must not go unnoticed. Beat
        # keeps the clock running (stopping it would stop every persona) but says so loudly.
        fleet = self.fleet
        if self.settings.allow_eviction:
            return  # said loudly at start; not again every sync
        try:
            check_eviction_policy(
                fleet.client, allow=self.settings.allow_eviction, url=fleet.settings.redis_url,
                process="beat",
            )  # fmt: skip
        except EvictingRedis as exc:
            _log.error("redis.evicting_policy", process="beat", policy=exc.policy, error=str(exc))

    # -- celery.beat.Scheduler ------------------------------------------------------------
    def setup_schedule(self) -> None:
        super().setup_schedule()
        settings = self.settings
        # Before the first sync writes anything: never schedule on an evicting Redis.
        refuse_to_start_on_eviction(settings, "beat")
        self.update_from_dict(
            {
                SWEEP: {"task": SWEEP, "schedule": timedelta(seconds=settings.sweep_interval)},
                SYNC: {"task": SYNC, "schedule": timedelta(seconds=settings.sync_interval)},
                REAP: {"task": REAP, "schedule": timedelta(seconds=settings.reap_interval)},
                RECOVER: {
                    "task": RECOVER,
                    "schedule": timedelta(seconds=settings.recover_interval),
                },
            }
        )
        self._start_metrics()
        self._run_in_process(SYNC)

    def apply_async(
        self,
        entry: ScheduleEntry,
        producer: Any = None,
        advance: bool = True,
        **kwargs: Any,
    ) -> Any:
        if entry.task not in IN_PROCESS:
            return super().apply_async(entry, producer, advance, **kwargs)
        if advance:
            self.reserve(entry)
        self._run_in_process(entry.task)
        return None

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        if entry.task in IN_PROCESS:
            # Skip the base class's "Sending due task" line: nothing is sent, and a line per
            # second per beat would drown the log.
            self.apply_async(entry, producer=producer, advance=False)
            return
        super().apply_entry(entry, producer=producer)

    @property
    def info(self) -> str:
        settings = self.settings
        return (
            f"    . fleet -> sweep every {settings.sweep_interval}s, sync every "
            f"{settings.sync_interval}s, reap every {settings.reap_interval}s, recover every "
            f"{settings.recover_interval}s (in-process, Redis server clock)"
        )

    # -- internals ------------------------------------------------------------------------
    def _run_in_process(self, task: str) -> None:
        runners: dict[str, Callable[[], None]] = {
            SWEEP: self._sweep,
            SYNC: self._run_sync,
            REAP: self._reap,
            RECOVER: self._recover,
        }
        started = time.perf_counter()
        try:
            runners[task]()
        except Exception as exc:  # one bad pass must never stop the fleet's clock
            refusal = as_redis_refusal(exc, self.settings.redis_url)
            if refusal is not None:
                # A Redis that is down or full fails every pass, once a second: one line each,
                # not a traceback (33 log lines a second). A full one is named as such, with
                # what to do; a lost connection keeps its own words (under `soulfleet up` the
                # embedded Redis is gone, and REDIS_URL advice would mislead).
                error = (
                    f"RedisFull: {refusal}"
                    if isinstance(refusal, RedisFull)
                    else f"RedisUnavailable: Redis at {refusal.url} did not answer "
                    f"({refusal.detail})"
                )
                _log.error(
                    "beat.task_failed",
                    task=task,
                    error=error,
                    seconds=round(time.perf_counter() - started, 4),
                )
                return
            _log.exception(
                "beat.task_failed",
                task=task,
                error=f"{type(exc).__name__}: {exc}",
                seconds=round(time.perf_counter() - started, 4),
            )

    def _start_metrics(self) -> None:
        if _collectors:
            return
        collector = metrics.LaneStateCollector(self.fleet.lane_counts)
        _collectors.append(collector)
        try:
            metrics.serve_metrics(
                self.settings.metrics_port, host=self.settings.metrics_host, collector=collector
            )
        except Exception as exc:  # metrics are an aid; beat runs without them
            _log.exception("beat.metrics_failed", error=str(exc))

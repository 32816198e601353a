"""The sweep: claim the due schedule entries, re-score them, tick their lanes through the fleet.

Why it is built this way:

- Cost grows with the number DUE, not the number registered: the schedule is one Redis sorted
  set scored by next-due ms, and a sweep reads only the ``score <= now`` head of it.
- Two beats cannot double-tick: ``lua/claim.lua`` takes up to ``SOULFLEET_SWEEP_BATCH`` due
  members and, in the same atomic step, re-scores them to ``now + CLAIM_TIMEOUT``. Python then
  computes each member's real next due time (:mod:`beat.schedule`: the next grid slot strictly
  after now, so a missed interval is skipped, never replayed) and writes them back in one
  compare-and-set script (``lua/rescore.lua``) that never overwrites a concurrent sync.
- Skips cost no model call (:mod:`beat.skips` decides them and says why: missing or blank
  HEARTBEAT.md, one that is a FIFO, a device or unreadable, quiet hours, a gone directory, a
  used-up budget, an idle persona between its stretched beats, a dream with nothing new); a
  dead-lettered lane is reported by the tick script. Everything else goes to
  :meth:`workers.fleet.Fleet.tick_lanes` in ONE batched call per claim batch, which folds the
  tick into the lane (coalescing) and publishes a turn only for lanes that were idle.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources

import structlog

from beat.schedule import ScheduleSpec, to_ms
from beat.skips import Claimed, HeartbeatFiles, Skips
from workers import metrics
from workers.fleet import Fleet
from workers.fleet.keys import split_schedule_member
from workers.persona.schedules import ActiveHours

__all__ = ["CLAIM_TIMEOUT", "MAX_BATCHES", "HeartbeatFiles", "SweepReport", "Sweeper"]

_log = structlog.get_logger("soulfleet.beat")

#: A claimed member whose claimer died before writing its next due time is due again after this.
CLAIM_TIMEOUT = 60.0
#: Claim batches per sweep at most, so one pass always ends (the next pass takes the rest).
MAX_BATCHES = 100
_FIELDS = re.compile("[\t\n]")


def _script(name: str) -> str:
    return resources.files("beat.lua").joinpath(name).read_text(encoding="utf-8")


@dataclass(slots=True)
class SweepReport:
    """Counts from one sweep pass (also logged as ``sweep.done``)."""

    due: int = 0
    emitted: int = 0
    coalesced: int = 0
    skipped: int = 0
    batches: int = 0
    seconds: float = 0.0


class Sweeper:
    """Runs sweep passes for one fleet. One per beat process; not shared between threads."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        batch: int | None = None,
        claim_timeout: float = CLAIM_TIMEOUT,
        max_batches: int = MAX_BATCHES,
    ) -> None:
        self._fleet = fleet
        self._client = fleet.client
        self._keys = fleet.keys
        self._clock = fleet.clock
        self._batch = batch or fleet.settings.sweep_batch
        self._claim_timeout = claim_timeout
        self._max_batches = max_batches
        self._claim = self._client.register_script(_script("claim.lua"))
        self._rescore = self._client.register_script(_script("rescore.lua"))
        self._specs: dict[str, tuple[ScheduleSpec, ActiveHours | None]] = {}
        # member -> (lane, kind, spec, hours) while the spec epoch stands (see claim.lua)
        self._known: dict[str, tuple[str, str, ScheduleSpec, ActiveHours | None]] = {}
        self._epoch: str | None = None
        self._skips = Skips(self._client, self._keys, max_age=fleet.settings.sync_interval)
        self._passes = 0
        self._last_logged = float("-inf")

    def run(self) -> SweepReport:
        """One pass: claim and handle due batches until nothing is due (or MAX_BATCHES)."""
        started = time.perf_counter()
        report = SweepReport()
        # Claim against the pass's start time: members re-scored in this pass are due strictly
        # after it, so the loop ends even for entries whose interval is shorter than the pass.
        now_ms = int(self._clock.time() * 1000)
        while report.batches < self._max_batches:
            claimed = self._claim_batch(now_ms)
            if not claimed:
                break
            report.batches += 1
            report.due += len(claimed)
            self._handle(claimed, report)
            if len(claimed) < self._batch:
                break
        report.seconds = time.perf_counter() - started
        self._finish(report)
        return report

    # -- claim and re-score ---------------------------------------------------------------
    def _claim_batch(self, now_ms: int) -> list[Claimed]:
        claim_ms = now_ms + int(self._claim_timeout * 1000)
        raw: list[str] = self._claim(
            keys=[self._keys.schedule, self._keys.schedule_epoch],
            args=[now_ms, claim_ms, self._batch],
        )
        self._check_epoch(str(raw[0]))
        if not raw[1]:
            return []
        fields = _FIELDS.split(str(raw[1]))
        members: list[str] = fields[0::2]
        known = self._known
        missing = [member for member in members if member not in known]
        if missing:
            self._learn(missing)
        claimed: list[Claimed] = []
        broken: list[str] = []
        nexts: list[str] = []
        at = self._clock.time()
        for member, score in zip(members, fields[1::2], strict=True):
            entry = known.get(member)
            if entry is None:
                lane, kind = split_schedule_member(member)
                broken.append(member)
                claimed.append(Claimed(member, lane, kind, int(float(score)), None, None))
                continue
            lane, kind, spec, hours = entry
            try:
                nexts.append(f"{member}\t{to_ms(spec.next_due(at))}")
            except (ValueError, ArithmeticError) as exc:  # a zone this host lacks, a cron
                # that stopped parsing, an every too large for the clock (an old entry)
                _log.error("sweep.bad_spec", member=member, error=str(exc))
                broken.append(member)
                known.pop(member, None)
                claimed.append(Claimed(member, lane, kind, int(float(score)), None, None))
                continue
            claimed.append(Claimed(member, lane, kind, int(float(score)), spec, hours))
        if nexts:
            # One argument, not two per member: redis-py encodes each argument in Python.
            self._rescore(keys=[self._keys.schedule], args=[claim_ms, "\n".join(nexts)])
        if broken:
            # The next registry sync sees the counts drift and rewrites these from the files.
            pipe = self._client.pipeline(transaction=True)
            pipe.zrem(self._keys.schedule, *broken)
            pipe.hdel(self._keys.schedule_spec, *broken)
            pipe.incr(self._keys.schedule_epoch)
            pipe.execute()
        return claimed

    def _check_epoch(self, epoch: str) -> None:
        """Forget the specs kept by member when a writer bumped the epoch (every writer of
        ``schedule:spec`` does: the registry sync, this sweep's removal of broken members)."""
        if epoch != self._epoch:
            self._known.clear()
            self._epoch = epoch

    def _learn(self, members: Sequence[str]) -> None:
        """Read and parse the specs of ``members`` (one HMGET per claim batch)."""
        raws = self._client.hmget(self._keys.schedule_spec, list(members))
        for member, spec_json in zip(members, raws, strict=True):
            text = spec_json.decode() if isinstance(spec_json, bytes) else spec_json
            spec, hours = self._spec(member, text or "")
            if spec is not None:
                lane, kind = split_schedule_member(member)
                self._known[member] = (lane, kind, spec, hours)

    def _spec(self, member: str, raw: str) -> tuple[ScheduleSpec | None, ActiveHours | None]:
        """The parsed spec and active hours, cached by the stored JSON (specs rarely change)."""
        cached = self._specs.get(raw)
        if cached is not None:
            return cached
        try:
            spec = ScheduleSpec.from_json(raw)
            hours = spec.active_hours()
        except (ValueError, ArithmeticError, TypeError, KeyError) as exc:
            _log.error("sweep.bad_spec", member=member, error=str(exc) if raw else "no spec")
            return None, None
        if len(self._specs) >= 200_000:
            self._specs.clear()
        self._specs[raw] = (spec, hours)
        return spec, hours

    # -- skip or tick ---------------------------------------------------------------------
    def _handle(self, claimed: Sequence[Claimed], report: SweepReport) -> None:
        # Looked up once per batch, not per lane: below INFO it is a no-op either way.
        info = _log.info
        now = self._clock.time()
        at = int(now * 1000)
        skipped: Counter[tuple[str, str]] = Counter()
        ticking, reasons = self._skips.sort(claimed, now)
        for item, reason in reasons:
            skipped[(item.kind, reason)] += 1
            info("tick.skipped", lane=item.lane, kind=item.kind, reason=reason, due=item.due, at=at)
        outcomes = self._fleet.tick_lanes([(item.lane, item.kind) for item in ticking])
        handled: Counter[tuple[str, str]] = Counter()
        for item, outcome in zip(ticking, outcomes, strict=True):
            if outcome.outcome == "queued":
                handled[(item.kind, "emitted")] += 1
                info("tick.emitted", lane=item.lane, kind=item.kind, due=item.due, at=at)
            elif outcome.outcome == "coalesced":
                handled[(item.kind, "coalesced")] += 1
                info("tick.coalesced", lane=item.lane, kind=item.kind, due=item.due, at=at)
            else:
                skipped[(item.kind, "dead_lettered")] += 1
                info(
                    "tick.skipped",
                    lane=item.lane,
                    kind=item.kind,
                    reason="dead_lettered",
                    due=item.due,
                    at=at,
                )
        for (kind, outcome_name), count in handled.items():
            metrics.TICKS.labels(kind=kind, outcome=outcome_name).inc(count)
        for (kind, reason), count in skipped.items():
            metrics.TICKS_SKIPPED.labels(kind=kind, reason=reason).inc(count)
        report.emitted += sum(n for (_, o), n in handled.items() if o == "emitted")
        report.coalesced += sum(n for (_, o), n in handled.items() if o == "coalesced")
        report.skipped += sum(skipped.values())

    def _finish(self, report: SweepReport) -> None:
        finished = self._clock.time()
        metrics.SWEEP_SECONDS.observe(report.seconds)
        metrics.SWEEP_DUE.set(report.due)
        metrics.LAST_SWEEP.set(finished)
        summary = {**asdict(report), "at": finished, "host": self._fleet.settings.hostname}
        summary["seconds"] = round(report.seconds, 6)
        self._client.set(self._keys.last_sweep, json.dumps(summary, sort_keys=True))
        self._passes += 1
        # An idle fleet would log one line a second per beat; say it at info when there was
        # work, on the first pass (start-up proof) and once a minute (liveness in the logs).
        loud = report.due > 0 or self._passes == 1 or finished - self._last_logged >= 60.0
        if loud:
            self._last_logged = finished
        (_log.info if loud else _log.debug)(
            "sweep.done",
            due=report.due,
            emitted=report.emitted,
            coalesced=report.coalesced,
            skipped=report.skipped,
            batches=report.batches,
            seconds=round(report.seconds, 6),
        )

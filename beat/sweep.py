"""The sweep: claim the due schedule entries, re-score them, tick their lanes through the fleet.

Why it is built this way:

- Cost grows with the number DUE, not the number registered: the schedule is one Redis sorted
  set scored by next-due ms, and a sweep reads only the ``score <= now`` head of it.
- Two beats cannot double-tick: ``lua/claim.lua`` takes up to ``SOULFLEET_SWEEP_BATCH`` due
  members and, in the same atomic step, re-scores them to ``now + CLAIM_TIMEOUT``. Python then
  computes each member's real next due time (:mod:`beat.schedule`: the next grid slot strictly
  after now, so a missed interval is skipped, never replayed) and writes them back in one
  compare-and-set script (``lua/rescore.lua``) that never overwrites a concurrent sync.
- Skips cost no model call: a heartbeat whose HEARTBEAT.md is absent or blank
  (``no_heartbeat_file``; looked at once per ``SOULFLEET_SYNC_INTERVAL`` at most, and re-read
  only when its mtime or size moved), one whose HEARTBEAT.md is a FIFO, a device or unreadable
  (``invalid_heartbeat_file``: never opened in a way that could block), a heartbeat outside
  its persona's active hours (``quiet_hours``), an entry whose directory is gone but not yet
  synced away (``unknown_persona``), a dead-lettered lane (``dead_lettered``, reported by the
  tick script). Everything else goes to :meth:`workers.fleet.Fleet.tick_lanes` in ONE batched
  call per claim batch, which folds the tick into the lane (coalescing) and publishes a turn
  only for lanes that were idle.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources

import structlog

from beat.schedule import ScheduleSpec, to_ms
from beat.sync import HEARTBEAT_FILE
from workers import metrics
from workers.fleet import Fleet
from workers.fleet.keys import split_schedule_member
from workers.persona.errors import PersonaError
from workers.persona.files import read_prefix
from workers.persona.home import MAX_FILE_BYTES
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


class HeartbeatFiles:
    """Whether a persona's HEARTBEAT.md is absent or blank, and whether its home exists.

    Each answer is kept for ``max_age`` seconds (the registry sync interval: an edit takes
    effect within it) before the file is looked at again, so a sweep of 100,000 due heartbeats
    makes no ``stat`` call for a home it checked recently; after that, the file is re-read
    only when its mtime or size changed.

    Read through :func:`workers.persona.files.read_prefix` (the one door): a FIFO, a device or
    a directory at that name is refused without blocking and counts as ``invalid`` (the registry
    sync reports the persona and removes its entries); a huge file costs at most the bootstrap
    cap. Nothing here may stop the sweep, so every error is an answer, never an exception.
    """

    def __init__(self, max_entries: int = 2_000_000, max_age: float = 10.0) -> None:
        self._cache: dict[str, tuple[float, int, int, bool | str | None]] = {}
        self._homes: dict[str, tuple[float, bool]] = {}
        self._max = max_entries
        self._max_age = max_age

    def blank(self, home: str, now: float | None = None) -> bool | str | None:
        """True if absent or blank, False if it has content, None if ``home`` itself is gone,
        ``"invalid"`` if something other than a readable regular file sits at the name."""
        cached = self._cache.get(home)
        if cached is not None and now is not None and now - cached[0] < self._max_age:
            return cached[3]
        path = os.path.join(home, HEARTBEAT_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            absent: bool | None = True if os.path.isdir(home) else None
            self._keep(home, (now or 0.0, -1, -1, absent), now)
            return absent
        except NotADirectoryError:
            self._keep(home, (now or 0.0, -1, -1, None), now)
            return None
        except OSError:
            self._keep(home, (now or 0.0, -1, -1, "invalid"), now)
            return "invalid"
        if cached is not None and cached[1:3] == (st.st_mtime_ns, st.st_size):
            self._keep(home, (now or 0.0, *cached[1:]), now)
            return cached[3]
        answer: bool | str
        try:
            raw = read_prefix(path, MAX_FILE_BYTES)
        except PersonaError as exc:
            _log.warning("sweep.heartbeat_file_refused", path=path, error=str(exc))
            answer = "invalid"
        else:
            answer = raw is None or raw.decode("utf-8", errors="replace").strip() == ""
        self._keep(home, (now or 0.0, st.st_mtime_ns, st.st_size, answer), now)
        return answer

    def home_exists(self, home: str, now: float) -> bool:
        """Whether ``home`` is a directory (a dream's check), looked at once per ``max_age``."""
        cached = self._homes.get(home)
        if cached is not None and now - cached[0] < self._max_age:
            return cached[1]
        exists = os.path.isdir(home)
        if len(self._homes) >= self._max:
            self._homes.clear()
        self._homes[home] = (now, exists)
        return exists

    def _keep(
        self, home: str, entry: tuple[float, int, int, bool | str | None], now: float | None
    ) -> None:
        if now is None:
            entry = (float("-inf"), *entry[1:])  # no clock given: never trusted without a stat
        if len(self._cache) >= self._max and home not in self._cache:
            self._cache.clear()
        self._cache[home] = entry


@dataclass(slots=True)
class SweepReport:
    """Counts from one sweep pass (also logged as ``sweep.done``)."""

    due: int = 0
    emitted: int = 0
    coalesced: int = 0
    skipped: int = 0
    batches: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class _Claimed:
    member: str
    lane: str
    kind: str
    due: int
    spec: ScheduleSpec | None
    hours: ActiveHours | None


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
        self._files = HeartbeatFiles(max_age=fleet.settings.sync_interval)
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
    def _claim_batch(self, now_ms: int) -> list[_Claimed]:
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
        claimed: list[_Claimed] = []
        broken: list[str] = []
        nexts: list[str] = []
        at = self._clock.time()
        for member, score in zip(members, fields[1::2], strict=True):
            entry = known.get(member)
            if entry is None:
                lane, kind = split_schedule_member(member)
                broken.append(member)
                claimed.append(_Claimed(member, lane, kind, int(float(score)), None, None))
                continue
            lane, kind, spec, hours = entry
            try:
                nexts.append(f"{member}\t{to_ms(spec.next_due(at))}")
            except (ValueError, ArithmeticError) as exc:  # a zone this host lacks, a cron
                # that stopped parsing, an every too large for the clock (an old entry)
                _log.error("sweep.bad_spec", member=member, error=str(exc))
                broken.append(member)
                known.pop(member, None)
                claimed.append(_Claimed(member, lane, kind, int(float(score)), None, None))
                continue
            claimed.append(_Claimed(member, lane, kind, int(float(score)), spec, hours))
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
    def _skip_reason(self, item: _Claimed, now: float) -> str | None:
        spec = item.spec
        if spec is None:
            return "unknown_persona"
        if spec.kind != "heartbeat":
            return None if self._files.home_exists(spec.home, now) else "unknown_persona"
        blank = self._files.blank(spec.home, now)
        if blank is None or blank == "invalid":
            return "unknown_persona" if blank is None else "invalid_heartbeat_file"
        if item.hours is not None and not item.hours.contains(now):
            return "quiet_hours"
        return "no_heartbeat_file" if blank else None

    def _handle(self, claimed: Sequence[_Claimed], report: SweepReport) -> None:
        # Looked up once per batch, not per lane: below INFO it is a no-op either way.
        info = _log.info
        now = self._clock.time()
        at = int(now * 1000)
        skipped: Counter[tuple[str, str]] = Counter()
        ticking: list[_Claimed] = []
        for item in claimed:
            reason = self._skip_reason(item, now)
            if reason is None:
                ticking.append(item)
                continue
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

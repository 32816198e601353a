"""The sweep: claim the due schedule entries, re-score them, tick their lanes through the fleet.

Why it is built this way:

- Cost grows with the number DUE, not the number registered: the schedule is one Redis sorted
  set scored by next-due ms, and a sweep reads only the ``score <= now`` head of it.
- Two beats cannot double-tick: ``lua/claim.lua`` takes up to ``SOULFLEET_SWEEP_BATCH`` due
  members and, in the same atomic step, re-scores them to ``now + CLAIM_TIMEOUT``. Python then
  computes each member's real next due time (:mod:`beat.due`, the numbers of
  :mod:`beat.schedule`: the next grid slot strictly after now, so a missed interval is skipped,
  never replayed, and a late tick stands for the slot it lands in) and decides the skips.
- Skips cost no model call (:mod:`beat.skips` decides them and says why: missing or blank
  HEARTBEAT.md, one that is a FIFO, a device or unreadable, quiet hours, a gone directory, a
  used-up budget, an idle persona between its stretched beats, a dream with nothing new); a
  dead-lettered lane is reported by the script.
- Then ONE script call per claimed batch (:meth:`workers.fleet.sweeps.SweepWrites.apply`)
  writes every member's next due time (compare-and-set on the claim score: a concurrent sync
  or re-claim wins) and folds a tick into every lane not skipped (coalescing; a turn is queued
  only for an idle lane), and the batch's queued turns are published in one
  ``publish_many``. Per member, Python only splits the claim reply, computes a float and
  formats one line: 100,000 due lanes are about twenty round trips.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources

import structlog

from beat import metrics as beat_metrics
from beat.due import next_due_ms
from beat.schedule import ScheduleSpec
from beat.skips import Claimed, HeartbeatFiles, Skips
from workers.fleet import Fleet
from workers.fleet.keys import split_schedule_member
from workers.fleet.sweeps import PendingApply
from workers.persona.schedules import ActiveHours

__all__ = ["CLAIM_TIMEOUT", "MAX_BATCHES", "HeartbeatFiles", "SweepReport", "Sweeper"]

_log = structlog.get_logger("soulfleet.beat")

#: A claimed member whose claimer died before writing its next due time is due again after this.
CLAIM_TIMEOUT = 60.0
#: Claim batches per sweep at most, so one pass always ends (the next pass takes the rest).
MAX_BATCHES = 100
_TICK = {"heartbeat": "h", "dream": "d"}
_OUTCOME = {"q": "emitted", "c": "coalesced"}


def _info_enabled() -> bool:
    """Whether per-tick INFO lines would be written: 100,000 no-op calls are not free."""
    bound = _log.bind()
    # Only level-filtering loggers (production's) define it on the class; any other logger
    # (tests capture events with one) forwards every name and gets every line.
    if getattr(type(bound), "is_enabled_for", None) is None:
        return True
    return bool(bound.is_enabled_for(logging.INFO))


def _script(name: str) -> str:
    return resources.files("beat.lua").joinpath(name).read_text(encoding="utf-8")


@dataclass(slots=True)
class _Batch:
    """One claimed batch between Python's decisions and the script call's answer."""

    claim_ms: int
    at: float
    lines: list[str]
    ticking: list[Claimed]
    reasons: list[tuple[Claimed, str]]
    pending: PendingApply | None = None


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
        self._specs: dict[str, tuple[ScheduleSpec, ActiveHours | None]] = {}
        # member -> (lane, kind, spec, hours) while the spec epoch stands (see claim.lua)
        self._known: dict[str, tuple[str, str, ScheduleSpec, ActiveHours | None]] = {}
        self._epoch: str | None = None
        self._skips = Skips(self._client, self._keys, max_age=fleet.settings.sync_interval)
        self._passes = 0
        self._last_logged = float("-inf")

    def run(self) -> SweepReport:
        """One pass: claim and handle due batches until nothing is due (or MAX_BATCHES).

        Batch N's script call is sent, not waited for: Python decides batch N+1 (claimed just
        before N was sent) while Redis applies N, then reads N's answer and publishes its
        turns. At most one batch is in flight."""
        started = time.perf_counter()
        report = SweepReport()
        # Claim against the pass's start time: members re-scored in this pass are due strictly
        # after it, so the loop ends even for entries whose interval is shorter than the pass.
        now_ms = int(self._clock.time() * 1000)
        claimed = self._claim_batch(now_ms, 0)
        in_flight: _Batch | None = None
        try:
            while claimed is not None:
                report.batches += 1
                report.due += len(claimed[1])
                batch = self._prepare(*claimed)
                more = len(claimed[1]) == self._batch and report.batches < self._max_batches
                claimed = self._claim_batch(now_ms, report.batches) if more else None
                batch.pending = self._fleet.sweeps.start_apply(
                    batch.claim_ms, int(batch.at * 1000), batch.lines
                )
                done, in_flight = in_flight, batch
                if done is not None:
                    self._report(done, report)
            done, in_flight = in_flight, None
            if done is not None:
                self._report(done, report)
        finally:
            if in_flight is not None and in_flight.pending is not None:
                # Failing anyway: read (and so release) the in-flight call's connection.
                with contextlib.suppress(Exception):
                    in_flight.pending.result()
        report.seconds = time.perf_counter() - started
        self._finish(report)
        return report

    # -- one claimed batch --------------------------------------------------------------
    def _claim_batch(self, now_ms: int, index: int) -> tuple[int, list[str], list[str]] | None:
        """Claim up to a batch: (its claim score, members, due scores), or None if none due."""
        # A claim score of its own per batch (+1 ms each): sweep_apply.lua finds the batch's
        # still-claimed members with one range read instead of a ZSCORE per member.
        claim_ms = now_ms + int(self._claim_timeout * 1000) + index
        raw: list[str] = self._claim(
            keys=[self._keys.schedule, self._keys.schedule_epoch],
            args=[now_ms, claim_ms, self._batch],
        )
        self._check_epoch(str(raw[0]))
        if not raw[1]:
            return None
        fields = str(raw[1]).split("\t")
        return claim_ms, fields[0::2], fields[1::2]

    def _prepare(self, claim_ms: int, members: list[str], scores: list[str]) -> _Batch:
        """Everything Python decides about one claimed batch: next due times, skips, lines."""
        known = self._known
        missing = [member for member in members if member not in known]
        if missing:
            self._learn(missing)
        at = self._clock.time()
        entries = [known.get(member) for member in members]
        specs = [entry[2] for entry in entries if entry is not None]
        dues = iter(next_due_ms(specs, at, after_tick=True))
        claimed: list[Claimed] = []
        broken: list[Claimed] = []
        for member, score, entry in zip(members, scores, entries, strict=True):
            if entry is None:
                lane, kind = split_schedule_member(member)
                broken.append(Claimed(member, lane, kind, int(float(score)), None, None))
                continue
            due = next(dues)
            if isinstance(due, str):  # a zone this host lacks, a cron that stopped parsing,
                # an every too large for the clock (an old entry)
                _log.error("sweep.bad_spec", member=member, error=due)
                known.pop(member, None)
                broken.append(Claimed(member, entry[0], entry[1], int(float(score)), None, None))
                continue
            lane, kind, spec, hours = entry
            claimed.append(Claimed(member, lane, kind, int(float(score)), spec, hours, due))
        ticking, reasons = self._skips.sort(claimed, at)
        if reasons:
            # A skip ticked nothing, so it stands for no slot: the slot it lands in is judged
            # again at its own due (an idle persona's one slot of its idle_every window, the
            # first slot inside its active hours), as before the late-tick rule.
            plain = next_due_ms([item.spec for item, _ in reasons if item.spec], at)
            reasons = [
                (item._replace(next_ms=due) if isinstance(due, int) else item, reason)
                for (item, reason), due in zip(reasons, plain, strict=True)
            ]
        lines = [f"{c.member}\t{c.next_ms}\t{_TICK[c.kind]}" for c in ticking]
        lines.extend(f"{c.member}\t{c.next_ms}\t-" for c, _ in reasons)
        if broken:
            # The next registry sync sees the counts drift and rewrites these from the files.
            pipe = self._client.pipeline(transaction=True)
            pipe.zrem(self._keys.schedule, *(c.member for c in broken))
            pipe.hdel(self._keys.schedule_spec, *(c.member for c in broken))
            pipe.incr(self._keys.schedule_epoch)
            pipe.execute()
        reasons.extend((c, "unknown_persona") for c in broken)
        return _Batch(claim_ms, at, lines, ticking, reasons)

    def _check_epoch(self, epoch: str) -> None:
        """Forget the specs kept by member when a writer bumped the epoch (every writer of
        ``schedule:spec`` does: the registry sync, this sweep's removal of broken members)."""
        if epoch != self._epoch:
            self._known.clear()
            self._epoch = epoch

    def _learn(self, members: Sequence[str]) -> None:
        """Read and parse the specs of ``members``: one script call per claim batch, and one
        ``json.loads`` for all of them (stored specs are canonical JSON, never a raw newline)."""
        key = self._keys.schedule_spec
        try:
            texts = self._fleet.sweeps.fields([f"{key}\t{member}" for member in members])
        except ValueError:  # a stored value with a raw newline (not one sync wrote): HMGET
            raws = self._client.hmget(key, list(members))
            texts = [raw.decode() if isinstance(raw, bytes) else raw or "" for raw in raws]
        parsed: list[object] | None = None
        if all(texts):
            try:
                parsed = json.loads(f"[{','.join(texts)}]")
            except ValueError:
                parsed = None  # one bad spec: parse one by one below, so only it is reported
            if parsed is not None and len(parsed) != len(texts):
                parsed = None  # a spec that is several JSON values: one by one
        for index, (member, text) in enumerate(zip(members, texts, strict=True)):
            data = parsed[index] if parsed is not None else None
            spec, hours = self._spec(member, text, data)
            if spec is None:
                continue
            lane, kind = split_schedule_member(member)
            if (lane, kind) != (spec.lane, spec.kind):
                _log.error("sweep.bad_spec", member=member, error="spec of another member")
                continue
            self._known[member] = (lane, kind, spec, hours)

    def _spec(
        self, member: str, raw: str, data: object = None
    ) -> tuple[ScheduleSpec | None, ActiveHours | None]:
        """The parsed spec and active hours (``data``: ``raw`` already parsed), cached by the
        stored JSON (specs rarely change)."""
        cached = self._specs.get(raw)
        if cached is not None:
            return cached
        try:
            spec = ScheduleSpec.from_json(raw) if data is None else ScheduleSpec.from_dict(data)
            hours = spec.active_hours()
        except (ValueError, ArithmeticError, TypeError, KeyError) as exc:
            _log.error("sweep.bad_spec", member=member, error=str(exc) if raw else "no spec")
            return None, None
        if len(self._specs) >= 200_000:
            self._specs.clear()
        self._specs[raw] = (spec, hours)
        return spec, hours

    # -- outcomes -------------------------------------------------------------------------
    def _report(self, batch: _Batch, report: SweepReport) -> None:
        """Wait for the batch's script call; publish the turns that queued; count (and, at
        INFO, log) every member's outcome."""
        assert batch.pending is not None
        applied = batch.pending.result()
        ticking, reasons, now = batch.ticking, batch.reasons, batch.at
        codes = applied.codes
        if len(codes) != len(ticking):
            raise RuntimeError(f"sweep script answered {len(codes)} ticks for {len(ticking)}")
        if "q" in codes:
            base = applied.base
            # Through Fleet.send: a broker that refuses hands the turns to the reaper's next
            # pass (they are queued in Redis already), not its 600 s wait for a lost message.
            self._fleet.send(
                [
                    (ticking[i].lane, f"{base}{i:08x}", ticking[i].kind)
                    for i, code in enumerate(codes)
                    if code == "q"
                ]
            )
        outcomes = Counter(zip((c.kind for c in ticking), codes, strict=True))
        skipped = Counter((c.kind, reason) for c, reason in reasons)
        for (kind, code), count in outcomes.items():
            if code == "d":
                skipped[(kind, "dead_lettered")] += count
            else:
                beat_metrics.TICKS.labels(kind=kind, outcome=_OUTCOME[code]).inc(count)
                if code == "q":
                    report.emitted += count
                else:
                    report.coalesced += count
        for (kind, reason), count in skipped.items():
            beat_metrics.TICKS_SKIPPED.labels(kind=kind, reason=reason).inc(count)
            report.skipped += count
        if _info_enabled():
            self._log_ticks(ticking, reasons, codes, int(now * 1000))

    @staticmethod
    def _log_ticks(
        ticking: Sequence[Claimed], reasons: Sequence[tuple[Claimed, str]], codes: str, at: int
    ) -> None:
        info = _log.info
        for item, reason in reasons:
            info("tick.skipped", lane=item.lane, kind=item.kind, reason=reason, due=item.due, at=at)
        for item, code in zip(ticking, codes, strict=True):
            if code == "d":
                info(
                    "tick.skipped",
                    lane=item.lane,
                    kind=item.kind,
                    reason="dead_lettered",
                    due=item.due,
                    at=at,
                )
            else:
                event = "tick.emitted" if code == "q" else "tick.coalesced"
                info(event, lane=item.lane, kind=item.kind, due=item.due, at=at)

    def _finish(self, report: SweepReport) -> None:
        finished = self._clock.time()
        beat_metrics.SWEEP_SECONDS.observe(report.seconds)
        beat_metrics.SWEEP_DUE.set(report.due)
        beat_metrics.LAST_SWEEP.set(finished)
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

"""Why a due tick is skipped without a model call: the rules beat applies before ticking.

Reasons, in the order they are checked (each logged as ``tick.skipped`` and counted in
``soulfleet_ticks_skipped_total``):

- from the files and the stored spec alone: ``unknown_persona`` (its directory is gone),
  ``quiet_hours`` (outside ``active_hours``), ``no_heartbeat_file``, ``blank_heartbeat``
  (a HEARTBEAT.md that asks for nothing: :func:`workers.persona.spend.heartbeat_blank`; the
  answer is cached by the file's mtime and size), ``invalid_heartbeat_file`` (a FIFO, a device
  or an unreadable file at that name: never opened in a way that could block);
- from Redis, in one script call per batch (none when no item needs one): ``budget``
  (today's tokens at or over the persona's daily budget; under ``skip_background`` not for a
  heartbeat whose inbox holds items: that turn is a conversation), ``idle`` (no inbound post for
  ``idle_after``: only the first slot of each ``idle_every`` window ticks), ``nothing_new`` (a
  dream with nothing written to the persona's transcripts or notes since its last pass).

``dead_lettered`` is the sweep script's answer, reported by the sweep.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, NamedTuple

import redis
import structlog

from beat.schedule import ScheduleSpec
from beat.sync import HEARTBEAT_FILE
from workers.fleet.keys import Keys
from workers.fleet.spend import LAST_PASS
from workers.fleet.sweeps import SweepWrites
from workers.persona.errors import PersonaError
from workers.persona.files import read_inside
from workers.persona.home import MAX_FILE_BYTES
from workers.persona.schedules import ActiveHours
from workers.persona.spend import heartbeat_blank, nothing_new, pass_times, usage_day

__all__ = ["Claimed", "FileState", "HeartbeatFiles", "Skips"]

_log = structlog.get_logger("soulfleet.beat")

FileState = Literal["absent", "blank", "ok", "invalid"]


class Claimed(NamedTuple):
    """One claimed schedule entry: its lane, kind, due ms, parsed spec (None: broken) and next
    due ms. A tuple, not a frozen dataclass: a sweep makes 100,000 of them."""

    member: str
    lane: str
    kind: str
    due: int
    spec: ScheduleSpec | None
    hours: ActiveHours | None
    next_ms: int = 0


class HeartbeatFiles:
    """Whether a persona's HEARTBEAT.md asks for anything, and whether its home exists.

    Each answer is kept for ``max_age`` seconds (the registry sync interval: an edit takes
    effect within it) before the file is looked at again, so a sweep of 100,000 due heartbeats
    makes no ``stat`` call for a home it checked recently; after that, the file is re-read only
    when its mtime or size changed.

    Read through :func:`workers.persona.files.read_inside` (the one door): a FIFO, a device or
    a directory at that name is refused without blocking and counts as ``invalid`` (the registry
    sync reports the persona and removes its entries); a huge file costs at most the bootstrap
    cap. Nothing here may stop the sweep, so every error is an answer, never an exception.
    """

    def __init__(self, max_entries: int = 2_000_000, max_age: float = 10.0) -> None:
        # home -> (looked at, mtime_ns, size, state)
        self._cache: dict[str, tuple[float, int, int, FileState | None]] = {}
        self._homes: dict[str, tuple[float, bool]] = {}
        self._max = max_entries
        self._max_age = max_age

    def state(self, home: str, now: float | None = None) -> FileState | None:
        """``absent`` (no file), ``blank`` (nothing actionable: :func:`heartbeat_blank`),
        ``ok``, ``invalid`` (something other than a readable regular file sits at the name),
        or None if ``home`` itself is gone. ``now`` (seconds) lets a recent answer stand."""
        cached = self._cache.get(home)
        if cached is not None and now is not None and now - cached[0] < self._max_age:
            return cached[3]
        path = os.path.join(home, HEARTBEAT_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            absent: FileState | None = "absent" if os.path.isdir(home) else None
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
        answer: FileState
        try:
            raw = read_inside(home, HEARTBEAT_FILE, MAX_FILE_BYTES)
        except PersonaError as exc:
            _log.warning("sweep.heartbeat_file_refused", path=path, error=str(exc))
            answer = "invalid"
        else:
            text = "" if raw is None else raw.decode("utf-8", errors="replace")
            answer = "blank" if heartbeat_blank(text) else "ok"
        self._keep(home, (now or 0.0, st.st_mtime_ns, st.st_size, answer), now)
        return answer

    def blank(self, home: str, now: float | None = None) -> bool | str | None:
        """True if absent or blank, False if it has content, None if ``home`` itself is gone,
        ``"invalid"`` if something other than a readable regular file sits at the name."""
        state = self.state(home, now)
        if state is None or state == "invalid":
            return state
        return state != "ok"

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
        self, home: str, entry: tuple[float, int, int, FileState | None], now: float | None
    ) -> None:
        if now is None:
            entry = (float("-inf"), *entry[1:])  # no clock given: never trusted without a stat
        if len(self._cache) >= self._max and home not in self._cache:
            self._cache.clear()
        self._cache[home] = entry


class Skips:
    """Decides which claimed entries are skipped, and why. One per sweeper."""

    def __init__(self, client: redis.Redis, keys: Keys, *, max_age: float = 10.0) -> None:
        self.client = client
        self.keys = keys
        self.files = HeartbeatFiles(max_age=max_age)
        self.fields = SweepWrites(client, keys).fields

    def static_reason(self, item: Claimed, now: float) -> str | None:
        """What the files and the spec alone say (no Redis)."""
        spec = item.spec
        if spec is None:
            return "unknown_persona"
        if spec.kind != "heartbeat":
            return None if self.files.home_exists(spec.home, now) else "unknown_persona"
        state = self.files.state(spec.home, now)
        if state is None or state == "invalid":
            return "unknown_persona" if state is None else "invalid_heartbeat_file"
        if item.hours is not None and not item.hours.contains(now):
            return "quiet_hours"
        return {"absent": "no_heartbeat_file", "blank": "blank_heartbeat"}.get(state)

    def spend_reasons(self, items: Sequence[Claimed], now: float) -> list[str | None]:
        """The skips that need Redis (one script call for the batch, and none when no item
        has a budget, an idle rule or a dream): a used-up budget, an idle persona between its
        stretched beats, a dream with nothing new."""
        reads, slots = self._reads(items, now)
        if not reads:
            return [None] * len(items)
        values = self.fields(reads)
        reasons: list[str | None] = []
        unseen: list[str] = []
        for item, (tokens, posted, passed) in zip(items, slots, strict=True):
            spec = item.spec
            assert spec is not None
            reason: str | None = None
            if tokens >= 0 and spec.budget is not None and int(values[tokens] or 0) >= spec.budget:
                reason = "budget"
            if posted >= 0 and spec.idle_after is not None:
                if not values[posted]:
                    unseen.append(item.lane)
                last_post = int(values[posted] or now * 1000) / 1000
                idle = now - last_post >= spec.idle_after
                if reason is None and idle and not spec.opens_idle_window(item.due / 1000):
                    reason = "idle"
            if passed >= 0:
                times = pass_times(values[passed])
                ended, began = (None, None) if times is None else times
                if reason is None and nothing_new(spec.home, spec.persona, ended, began):
                    reason = "nothing_new"
            reasons.append(reason)
        self._conversations_go_on(items, reasons)
        if unseen:
            # A persona nobody ever posted to counts as posted to when beat first saw it.
            pipe = self.client.pipeline(transaction=False)
            for lane in unseen:
                pipe.hsetnx(self.keys.lane(lane), "last_post", int(now * 1000))
            pipe.execute()
        return reasons

    def _conversations_go_on(self, items: Sequence[Claimed], reasons: list[str | None]) -> None:
        """Un-skip a budget-skipped heartbeat whose inbox holds items, under
        ``skip_background``: its turn is a conversation, which that rule lets run (an item
        posted without waking the persona otherwise waited for the budget's reset). One
        pipelined LLEN per such lane: only over-budget personas pay it."""
        over = [
            n
            for n, (item, reason) in enumerate(zip(items, reasons, strict=True))
            if reason == "budget"
            and item.spec is not None
            and item.spec.kind == "heartbeat"
            and item.spec.on_exceed == "skip_background"
        ]
        if not over:
            return
        pipe = self.client.pipeline(transaction=False)
        for n in over:
            pipe.llen(self.keys.inbox(items[n].lane))
        for n, depth in zip(over, pipe.execute(), strict=True):
            if int(depth) > 0:
                reasons[n] = None

    def _reads(
        self, items: Sequence[Claimed], now: float
    ) -> tuple[list[str], list[tuple[int, int, int]]]:
        """The hash fields the spend checks of ``items`` need (``"<key>\\t<field>"``), and per
        item where its budget, last post and last pass sit among them (-1: not read)."""
        reads: list[str] = []
        slots: list[tuple[int, int, int]] = []
        days: dict[str, str] = {}
        lane_key = self.keys.lane
        for item in items:
            spec = item.spec
            assert spec is not None
            tokens = posted = passed = -1
            if spec.budget is not None:
                day = days.get(spec.budget_timezone)
                if day is None:
                    day = days[spec.budget_timezone] = usage_day(now, spec.budget_timezone)
                tokens = len(reads)
                reads.append(f"{self.keys.usage(day, spec.persona)}\ttokens")
            if spec.kind == "heartbeat" and spec.idle_after is not None:
                posted = len(reads)
                reads.append(f"{lane_key(item.lane)}\tlast_post")
            if spec.kind == "dream":
                passed = len(reads)
                reads.append(f"{lane_key(item.lane)}\t{LAST_PASS}")
            slots.append((tokens, posted, passed))
        return reads, slots

    def sort(
        self, claimed: Sequence[Claimed], now: float
    ) -> tuple[list[Claimed], list[tuple[Claimed, str]]]:
        """The items to tick, and the skipped ones with their reasons."""
        passing: list[Claimed] = []
        reasons: list[tuple[Claimed, str]] = []
        for item in claimed:
            reason = self.static_reason(item, now)
            if reason is None:
                passing.append(item)
            else:
                reasons.append((item, reason))
        spends = self.spend_reasons(passing, now)
        if spends.count(None) == len(spends):
            return passing, reasons
        ticking: list[Claimed] = []
        for item, spend in zip(passing, spends, strict=True):
            if spend is None:
                ticking.append(item)
            else:
                reasons.append((item, spend))
        return ticking, reasons

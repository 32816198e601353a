"""What ``soulfleet up`` tells its terminal: fleet events, surfaced beats, a status line.

``up`` starts its children with ``SOULFLEET_LOG_FORMAT=json``, so their log files are a stream
of structured events; :class:`LogTail` reads what is new in each file and :class:`Reporter`
turns the events worth a person's attention into one short line each:

- ``ready``   a worker or beat came up (``worker.ready``, the first ``sweep.done``);
- ``memory``  a persona wrote its memory (``memory.write``);
- ``dream``   a dreamer pass logged to ``memory/log.md``;
- ``silent``  the FIRST silent heartbeat (later ones are only counted: silence is the default);
- ``error``   a failed or dead-lettered turn, an invalid persona, a turn whose input alone is
              over its token budget (no model call: it repeats every turn), and any other
              error-level line: each DISTINCT error once, tagged ``[E1]``, ``[E2]`` …; repeats
              are only counted, and the status line says ``E1 x5`` (a crash loop must not flood the
              terminal, and five retries of one failure are one problem);
- ``fixed``   beat found a persona valid again (its dead lanes still need a revive);
- ``beat``    a surfaced beat, from the beats stream (the same feed ``soulfleet beats`` reads);
- ``status``  every few seconds: lanes by state (idle counted from beat's live registry, so
              personas added while ``up`` runs count), personas and invalid ones, beats
              surfaced/silent, turns, and the errors that repeated.

Why logs and not Redis for the counts: a silent beat leaves nothing in Redis by design (only
surfaced beats are published), but its ``turn.end`` event says ``silent``; the logs are the
honest record of what the workers did.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.cli.health import TRANSIENT_DEAD_PREFIX, invalid_personas
from workers.fleet import Fleet
from workers.fleet.beats import Beat, Beats
from workers.fleet.registry import DREAMER_SUFFIX
from workers.persona.checkup import input_over_budget_remedy

__all__ = ["LogTail", "Reporter", "Tally", "follow_beats", "live_status"]

Echo = Callable[[str], None]

#: A duration in an error's text ("changed 6s ago", "retry in 21s"): left out of its identity.
_DURATION = re.compile(r"\b\d+(?:\.\d+)?s\b")
#: A task, turn or item id (a UUID, or 32 hex digits): left out of an error's identity.
_ID = re.compile(r"\b[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\b", re.I)


#: fail.lua's prefix of a transient dead letter (it counts its seconds per lane).
_DEAD_PREFIX = re.compile(f"^{TRANSIENT_DEAD_PREFIX}")


def _anonymous(text: str) -> str:
    """``text`` without what differs between repeats of one error: durations and ids."""
    return _ID.sub("#id", _DURATION.sub("#s", text))


class LogTail:
    """New JSON events appended to one log file since the last read (partial lines wait).

    Log files are appended to across runs, so `up` makes its tails with :meth:`at_end` before
    starting the children: a restart never replays the previous run's events.
    """

    def __init__(self, path: Path, source: str, offset: int = 0) -> None:
        self.path = path
        self.source = source
        self._offset = offset
        self._partial = b""

    @classmethod
    def at_end(cls, path: Path, source: str) -> LogTail:
        """A tail that starts after whatever ``path`` holds now (nothing if it is missing)."""
        try:
            offset = path.stat().st_size
        except FileNotFoundError:
            offset = 0
        return cls(path, source, offset)

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        events: list[dict[str, Any]] = []
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                record.setdefault("_source", self.source)
                events.append(record)
        return events


@dataclass
class Tally:
    """Running counts for the status line."""

    turns: int = 0
    surfaced: int = 0
    silent: int = 0
    memory_writes: int = 0
    dream_passes: int = 0
    errors: int = 0
    ready: set[str] = field(default_factory=set)


def _stamp(when: float | None = None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(time.time() if when is None else when))


def _short(text: object, limit: int = 160) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class Reporter:
    """Turns events and beats into terminal lines and keeps the :class:`Tally`."""

    def __init__(self, echo: Echo) -> None:
        self.echo = echo
        self.tally = Tally()
        #: distinct error -> [its number (E1, E2 …), how many times it happened]
        self._errors: dict[tuple[str, ...], list[int]] = {}
        #: distinct error -> the lanes it happened on (one outage is one error, not one a lane)
        self._error_lanes: dict[tuple[str, ...], set[str]] = {}
        self._dead_turns: set[tuple[str, str]] = set()

    def error(self, key: tuple[str, ...], text: str, lane: str = "") -> None:
        """Print a distinct error once (numbered); count every repeat, and the lanes it hit,
        for the status line."""
        self.tally.errors += 1
        if lane:
            self._error_lanes.setdefault(key, set()).add(lane)
        seen = self._errors.get(key)
        if seen is not None:
            seen[1] += 1
            return
        number = len(self._errors) + 1
        self._errors[key] = [number, 1]
        self.line("error", f"[E{number}] {text}")

    def repeated_errors(self) -> list[tuple[int, int, int]]:
        """``(number, count, lanes)`` of each error seen more than once, most frequent first."""
        repeated = [
            (n, c, len(self._error_lanes.get(key, ())))
            for key, (n, c) in self._errors.items()
            if c > 1
        ]
        return sorted(repeated, key=lambda row: (-row[1], row[0]))

    def line(self, tag: str, text: str, when: float | None = None) -> None:
        self.echo(f"{_stamp(when)} {tag:<7} {text}")

    def beat(self, beat: Beat) -> None:
        self.tally.surfaced += 1
        self.line("beat", f"{beat.persona}: {_short(beat.text)}", beat.time or None)

    def events(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            self.event(event)

    def event(self, event: Mapping[str, Any]) -> None:
        name = event.get("event")
        source = str(event.get("_source", "?"))
        lane = str(event.get("lane") or "")
        persona = lane.removesuffix(DREAMER_SUFFIX)
        if name == "worker.ready":
            self.tally.ready.add(source)
            pool, threads = event.get("pool", "?"), event.get("concurrency", "?")
            self.line("ready", f"{source} (pool {pool}, concurrency {threads})")
        elif name == "sweep.done" and source not in self.tally.ready:
            self.tally.ready.add(source)
            self.line("ready", f"{source} is sweeping schedules")
        elif name == "memory.write":
            self._memory(event, lane, persona)
        elif name == "turn.end":
            self._turn_end(event, lane, persona)
        elif name in ("turn.dead_lettered", "lane.dead_lettered"):
            error = _short(event.get("error") or event.get("reason") or "")
            # The lane (lanes.py) and the turn both log one dead-lettering: count it once.
            turn = (lane, str(event.get("turn_id") or ""))
            if turn[1] and turn in self._dead_turns:
                return
            self._dead_turns.add(turn)
            # Keyed by the cause, not the lane: a revoked key dead-letters every lane that
            # runs, one error (its lanes counted on the status line), not one line per lane.
            whole = " ".join(str(event.get("error") or event.get("reason") or "").split())
            self.error(
                ("dead", _anonymous(_DEAD_PREFIX.sub("", whole))),
                f"lane {lane or '?'} dead-lettered: {error}",
                lane,
            )
        elif name == "registry.invalid":
            error = _short(event.get("error", ""))
            self.error(
                ("invalid", str(event.get("persona")), error),
                f"persona {event.get('persona')} is invalid ({event.get('key') or 'file'}): "
                f"{error}",
            )
        elif name == "registry.valid_again":
            persona_name = event.get("persona")
            self.line(
                "fixed",
                f"persona {persona_name} is valid again; a lane of it that was dead-lettered "
                f"stays dead until `soulfleet revive {persona_name}`",
            )
        elif name == "turn.input_over_budget":
            # A warning in the worker, but it repeats on every turn until someone acts.
            self.error(
                ("over_budget", lane),
                f"{lane or '?'}: turn incomplete, no model call: its input alone is about "
                f"{event.get('estimated_input_tokens', '?')} tokens, over the turn's budget of "
                f"{event.get('max_tokens', '?')} (SOULFLEET_TURN_MAX_TOKENS); "
                + input_over_budget_remedy(
                    lane.removesuffix(DREAMER_SUFFIX) or "PERSONA",
                    dreamer=lane.endswith(DREAMER_SUFFIX),
                ),
            )
        elif event.get("level") in ("error", "critical"):
            self._other_error(source, str(name), event)

    def _other_error(
        self, source: str, message: str, event: Mapping[str, Any] | None = None
    ) -> None:
        # The event name alone ("beat.task_failed") says what failed, not why: the line carries
        # the event's own reason and hint when it has them (the log keeps the whole record).
        detail = [str(event[key]) for key in ("error", "hint") if event and event.get(key)]
        text = f"{message}: {'; '.join(detail)}" if detail else message
        # Keyed by the reason too: a second beat.task_failed with another cause is its own error.
        # And without ids and durations: Celery's "Couldn't ack '<task id>'" for 50 tasks during
        # one outage is one error.
        key = ("log", source, _anonymous(message[:120]),
               _anonymous(str(event.get("error", ""))[:200]) if event else "")  # fmt: skip
        self.error(key, f"{source}: {_short(text, 400)} (see its log)")

    def _memory(self, event: Mapping[str, Any], lane: str, persona: str) -> None:
        self.tally.memory_writes += 1
        path = str(event.get("path", "?"))
        if lane.endswith(DREAMER_SUFFIX) and path == "memory/log.md":
            self.tally.dream_passes += 1
            self.line("dream", f"{persona}: dream pass logged to {path}")
        else:
            action = event.get("action", "write")
            self.line("memory", f"{persona or '?'} wrote {path} ({action})")

    def _turn_end(self, event: Mapping[str, Any], lane: str, persona: str) -> None:
        self.tally.turns += 1
        status = event.get("status")
        if status in ("skipped", "refused"):
            # No model call by the spend rules (budget, nothing_new): not an error.
            self.line("skip", f"{lane}: turn {status} ({event.get('reason', '?')}), no model call")
            return
        if status not in ("done", "incomplete"):
            error = _short(event.get("error", ""))
            # Keyed without the lane: a provider outage failing 200 lanes is one error, shown
            # once with the first lane it hit; the status line counts the lanes. And without
            # the durations in it: a persona mid-edit failing every few seconds says "changed
            # 6s ago", then "8s ago", one error all the same.
            whole = " ".join(str(event.get("error", "")).split())  # not cut: a cut moves
            key = ("turn", str(status), _anonymous(whole))
            self.error(key, f"{lane}: turn {status}: {error}", lane)
            return
        heartbeat = not lane.endswith(DREAMER_SUFFIX) and int(event.get("ticks") or 0) > 0
        if heartbeat and event.get("silent"):
            self.tally.silent += 1
            if self.tally.silent == 1:
                self.line(
                    "silent",
                    f"{persona}: heartbeat answered HEARTBEAT_OK, so nothing surfaced "
                    "(silent beats are counted on the status line from now on)",
                )

    def status(
        self,
        counts: Mapping[str, int],
        total_lanes: int,
        *,
        personas: int | None = None,
        invalid: int = 0,
    ) -> None:
        """The status line. ``counts["idle"]``, when given, is the live count (beat's registry);
        else idle is ``total_lanes`` less the busy ones."""
        queued, running, dead = (counts.get(k, 0) for k in ("queued", "running", "dead"))
        busy = queued + running + dead + counts.get("retry", 0) + counts.get("deferred", 0)
        idle = counts.get("idle", max(0, total_lanes - busy))
        t = self.tally
        who = ""
        if personas is not None:
            who = f"personas {personas}" + (f" ({invalid} invalid)" if invalid else "") + " | "
        repeated = self.repeated_errors()
        errors = ""
        if repeated:
            shown = ", ".join(
                f"E{number} x{count}" + (f" on {lanes} lanes" if lanes > 1 else "")
                for number, count, lanes in repeated[:5]
            )
            errors = f" | errors {shown}" + (" ..." if len(repeated) > 5 else "")
        # Lanes waiting out a retry or an open breaker are neither idle nor busy: said when any.
        waiting = "".join(
            f", {counts[key]} {word}"
            for key, word in (("retry", "retrying"), ("deferred", "deferred"))
            if counts.get(key)
        )
        self.line(
            "status",
            f"{who}lanes {idle} idle, {queued} queued, {running} running, {dead} dead{waiting}"
            f" | beats {t.surfaced} surfaced, {t.silent} silent"
            f" | turns {t.turns} | memory writes {t.memory_writes}, dream passes {t.dream_passes}"
            f"{errors}",
        )


def follow_beats(
    fleet: Fleet,
    out: queue.Queue[Beat | Exception],
    stop: threading.Event,
    *,
    retry: float = 2.0,
) -> None:
    """Thread body: surfaced beats from the stream into ``out`` until ``stop``. An error (Redis
    away) is put in ``out`` once per outage, for the main loop to report; the feed then tries
    again every ``retry`` seconds and resumes after the last beat it gave, missing none."""
    feed = Beats(fleet.client, fleet.keys)
    cursor = "$"
    failing = False
    while not stop.is_set():
        try:
            if cursor == "$":  # resolved once: a retry must not skip what came meanwhile
                cursor = feed.last_id()
            for beat in feed.follow(cursor, block_ms=1000, stop=stop):
                failing = False
                cursor = beat.id
                out.put(beat)
            return
        except Exception as exc:  # reported by the main loop; up keeps supervising
            if not failing:
                out.put(exc)
            failing = True
            stop.wait(retry)


def live_status(reporter: Reporter, fleet: Fleet, lanes_at_start: int) -> None:
    """The status line from live counts: idle lanes and personas from beat's registry (personas
    added or removed while `up` runs count); before beat's first sync, the lanes at start."""
    counts: dict[str, int] = dict(fleet.lane_counts())
    if fleet.client.get(fleet.keys.registry_lanes) is None:
        counts.pop("idle", None)
        reporter.status(counts, lanes_at_start)
        return
    invalid = len(invalid_personas(fleet))
    personas = int(fleet.client.hlen(fleet.keys.registry))
    reporter.status(counts, lanes_at_start, personas=personas, invalid=invalid)

"""The in-process heartbeat driver: a persona on its own clock (docs/persona.md §3).

It is the reference for what the distributed fleet does with Redis lanes, in a few dozen lines
of plain Python: each interval a tick is posted to the persona's OWN inbox; when the persona is
idle it is woken, and one turn drains the whole inbox (``render_inbox`` with the ticks folded
into one counted entry); anything that arrives during a running turn (ticks included) waits,
and is drained by exactly ONE following turn, so a beat slower than its turn never piles up.
A heartbeat turn's reply containing ``HEARTBEAT_OK`` is silent; a substantive one goes to
``on_beat`` (a turn woken only by posted events is not a beat: its result is ``last_result``).

Turns continue the persona's session (:mod:`workers.persona.session_plan`): the conversation
and the soul frozen at the session's start are replayed on every turn; a silent beat leaves
nothing in the session, a surfaced one is appended so a reply to it has context. Dream passes
run each in a fresh session of their own.

Every timer goes through an injectable :class:`~workers.persona.clock.Clock`. Turns run in the
thread that triggers them (the timer callback, or the caller of ``wake``): with a
:class:`~workers.persona.clock.VirtualClock` a test drives beats deterministically with
``clock.advance``, and a model that advances the clock mid-turn makes ticks arrive during the
turn. A lock guards the inbox so the same code is safe on the real clock, whose timers fire on
their own threads.

A persona whose persona.toml has ``[dream] every = ...`` also gets its dreamer on the same clock,
on its own lane, with its replies never surfaced (what a dream did is in ``note:log``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import structlog

from workers.persona.agent import AgentDef, from_dir
from workers.persona.clock import Clock, Timer
from workers.persona.dream_agent import dreamer
from workers.persona.heartbeat import is_silent
from workers.persona.inbox import InboxItem, render_inbox
from workers.persona.loop import Budget, RunResult
from workers.persona.models import Model
from workers.persona.runner import ModelChoice, model_for, run_agent
from workers.persona.spend import heartbeat_file_skip
from workers.persona.transcripts import FileTranscripts

__all__ = ["HeartbeatDriver", "start_agent"]

_log = structlog.get_logger("soulfleet.heartbeat")


class HeartbeatDriver:
    """One agent on one clock. Build it with :func:`start_agent`.

    ``beats`` holds the substantive replies so far (HEARTBEAT_OK excluded), ``turns`` counts the
    turns run, ``last_result`` is the latest turn's result.
    """

    def __init__(
        self,
        agent: AgentDef,
        *,
        every: float,
        clock: Clock,
        model: Model,
        on_beat: Callable[[str], None] | None = None,
        budget: Budget | None = None,
        surface: bool = True,
    ) -> None:
        if not every > 0:
            raise ValueError(f"every must be a positive number of seconds, got {every!r}")
        self.agent = agent
        self.every = float(every)
        self.clock = clock
        self.model = model
        self.on_beat = on_beat
        self.budget = budget if budget is not None else Budget()
        self.beats: list[str] = []
        self.turns = 0
        self.last_result: RunResult | None = None
        self.dreamer: HeartbeatDriver | None = None
        self._surface = surface
        self._lock = threading.Lock()
        self._inbox: list[InboxItem] = []
        self._ticks = 0
        self._running = False
        self._stopped = False
        self._timer: Timer | None = None

    # -- the host's seam --------------------------------------------------------------------

    def start(self) -> HeartbeatDriver:
        """Arm the first beat, ``every`` seconds from now."""
        with self._lock:
            if self._timer is None and not self._stopped:
                self._timer = self.clock.call_later(self.every, self._beat)
        return self

    def post(
        self,
        text: str,
        sender: str,
        channel: str,
        *,
        wake: bool = False,
        trusted: bool | None = None,
    ) -> InboxItem:
        """Put an event in the inbox (provenance kept). It is seen by the next turn; pass
        ``wake=True`` (or call :meth:`wake`) to start that turn now if the persona is idle.
        ``trusted`` is the caller's say (``None``: judged from the sender, see InboxItem)."""
        item = InboxItem.create(text, sender, channel, trusted=trusted, clock=self.clock)
        with self._lock:
            self._inbox.append(item)
        if wake:
            self.wake()
        return item

    def wake(self) -> bool:
        """If idle and anything is pending, run turns until the inbox is empty.

        Returns False when there was nothing to do or a turn is already running (that turn's
        follow-up will pick the pending work up).
        """
        return self._pump()

    def stop(self) -> None:
        """Cancel the beats (and the dreamer's). A running turn finishes; no new one starts."""
        with self._lock:
            self._stopped = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if self.dreamer is not None:
            self.dreamer.stop()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def pending(self) -> tuple[int, int]:
        """``(items, ticks)`` waiting for the next turn."""
        with self._lock:
            return len(self._inbox), self._ticks

    # -- internals --------------------------------------------------------------------------

    def _beat(self) -> None:
        with self._lock:
            if self._stopped:
                return
            # Re-arm first: the next beat is due `every` after this one, however long the turn.
            self._timer = self.clock.call_later(self.every, self._beat)
        skipped = self._skip_reason()
        if skipped is not None:
            _log.debug("heartbeat.skipped", lane=self.agent.name, reason=skipped)
            return
        with self._lock:
            self._ticks += 1
        self._pump()

    def _skip_reason(self) -> str | None:
        """Why this beat is skipped, as the fleet's beat skips it: outside ``active_hours``, or a
        HEARTBEAT.md that is missing or asks for nothing (a dreamer's passes are never
        skipped here)."""
        if self.agent.kind != "persona":
            return None
        schedule = self.agent.heartbeat
        hours = None if schedule is None else schedule.active_hours
        if hours is not None and not hours.contains(self.clock.time()):
            return "quiet_hours"
        return heartbeat_file_skip(self.agent.home)

    def _pump(self) -> bool:
        with self._lock:
            if self._running or self._stopped or not (self._inbox or self._ticks):
                return False
            self._running = True
        try:
            while True:
                with self._lock:
                    items, ticks = self._inbox, self._ticks
                    if self._stopped or not (items or ticks):
                        self._running = False
                        return True
                    self._inbox, self._ticks = [], 0
                if not self._turn(items, ticks):
                    with self._lock:
                        self._running = False
                    return True
        except BaseException:
            with self._lock:
                self._running = False
            raise

    def _turn(self, items: list[InboxItem], ticks: int) -> bool:
        """Run one turn; False if it could not run (its items are put back for a later try)."""
        channel = "dream" if self.agent.kind == "dreamer" else "heartbeat"
        prompt = render_inbox(items, ticks, persona=self.agent.name, tick_channel=channel)
        try:
            result = run_agent(
                self.agent,
                prompt,
                model=self.model,
                budget=self.budget,
                clock=self.clock,
                session=True,
                beat=bool(ticks) and not items,
            )
        except Exception as exc:
            # A persona whose directory vanished, or a transcript that cannot be written: keep
            # the items (never lose an event) and let the next beat or wake try again.
            _log.error(
                "heartbeat.turn_failed",
                lane=self.agent.name,
                error=str(exc),
                kind=type(exc).__name__,
            )
            with self._lock:
                self._inbox[:0] = items
            return False
        self.turns += 1
        self.last_result = result
        _log.info(
            "heartbeat.turn",
            lane=self.agent.name,
            items=len(items),
            ticks=ticks,
            status=result.status,
            limit=result.limit,
        )
        if result.status != "done":
            _log.warning(
                "heartbeat.turn_unfinished",
                lane=self.agent.name,
                status=result.status,
                limit=result.limit,
                error=result.error,
            )
            return True
        # Only a heartbeat turn (one that carried ticks) can surface, as in the fleet: a turn
        # woken by a posted event answers that event (see last_result), it is not a beat.
        if self._surface and ticks and result.text.strip() and not is_silent(result.text):
            self.beats.append(result.text)
            if self.on_beat is not None:
                try:
                    self.on_beat(result.text)
                except Exception as exc:
                    _log.error("heartbeat.on_beat_failed", lane=self.agent.name, error=str(exc))
        return True


def start_agent(
    agent_or_path: AgentDef | str | os.PathLike[str],
    *,
    every: float,
    clock: Clock,
    model: ModelChoice = None,
    on_beat: Callable[[str], None] | None = None,
    budget: Budget | None = None,
) -> HeartbeatDriver:
    """Give a persona its own clock: a tick every ``every`` seconds; returns the started driver.

    ``model`` is chosen as for ``run`` (argument, persona.toml, SOULFLEET_MODEL, built-in).
    A persona with ``[dream] every = ...`` also gets its dreamer, on the same clock, on lane
    ``<name>-dreamer``, reading the persona's own transcripts; ``stop()`` stops both. (A cron
    dream schedule is the fleet's job: beat owns cron.)
    """
    agent = agent_or_path if isinstance(agent_or_path, AgentDef) else from_dir(agent_or_path)
    driver = HeartbeatDriver(
        agent,
        every=every,
        clock=clock,
        model=model_for(agent, model),
        on_beat=on_beat,
        budget=budget,
    )
    schedule = agent.dream
    if agent.kind == "persona" and schedule is not None and schedule.every is not None:
        store = FileTranscripts(agent.home, lanes=[agent.name], clock=clock)
        dream = dreamer(
            agent.home,
            store=store,
            instructions=schedule.instructions,
            name=f"{agent.name}-dreamer",
        )
        driver.dreamer = HeartbeatDriver(
            dream,
            every=schedule.every,
            clock=clock,
            model=model_for(dream, model),
            budget=budget,
            surface=False,
        ).start()
    elif schedule is not None:
        _log.info("heartbeat.dream_cron_skipped", lane=agent.name, cron=schedule.cron)
    return driver.start()

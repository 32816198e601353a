"""The host API: what inbound channels, beat and the CLI call to reach a fleet.

docs/persona.md §3 leaves delivering external events to the host; :class:`Fleet` is that seam::

    fleet = connect()          # workers.publisher.connect: a Fleet publishing through Celery
    fleet.post("ava", "text", sender="external", channel="api", wake=True)
    fleet.tick("ava", kind="heartbeat")
    fleet.status("ava")
    fleet.beats(count=100)
    fleet.run("ava", "what is my name?")        # continues ava's session
    fleet.session("ava"); fleet.reset_session("ava")

State lives in Redis lanes (:mod:`workers.fleet.lanes`); a Celery message is only a wake-up that
names ``(lane, turn_id)``. Publishing happens here, after the lane script has decided a turn is
due, so a lost publish is repaired by the reaper and a duplicate is dropped at turn start.
What the fleet reports (status, session, usage, lane counts) is :mod:`workers.fleet.reports`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import redis
import structlog

from workers.fleet import dead_letters
from workers.fleet.beats import Beats
from workers.fleet.breaker import Breaker
from workers.fleet.clients import fleet_client
from workers.fleet.door_settings import ModelDefaults
from workers.fleet.errors import (
    BudgetStopped,
    InboxFull,
    LaneDeadLettered,
    RedisUnavailable,
)
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.outcomes import PostOutcome, Repair, RunReply, TickOutcome
from workers.fleet.recovery import Backoff, Recovery
from workers.fleet.registry import PersonaRegistry
from workers.fleet.reports import FleetReports
from workers.fleet.scripts import redis_errors
from workers.fleet.servertime import ServerClock
from workers.fleet.spend import LAST_PASS, next_reset, persona_budget
from workers.fleet.sweeps import SweepWrites
from workers.fleet.usage import UsageLedger
from workers.persona.checkup import check_persona
from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import PersonaError
from workers.persona.inbox import InboxItem
from workers.persona.mcp_servers import FleetServer
from workers.persona.spend import (
    BACKGROUND_KINDS,
    DailyBudget,
    budget_refuses,
    nothing_new,
    pass_times,
)
from workers.settings import Settings

__all__ = ["Fleet", "Publisher", "RunReply"]

_log = structlog.get_logger("soulfleet.fleet")


class Publisher(Protocol):
    """Sends turn wake-ups to workers. Celery in production
    (:class:`workers.publisher.CeleryPublisher`, wired by the Celery side); a recorder in tests.

    A lane is queued in Redis before its wake-up is published, so a publisher that raises
    leaves a lane the reaper re-publishes; it must raise
    :class:`~workers.fleet.errors.RedisUnavailable` for a broker it cannot reach."""

    def publish(self, lane: str, turn_id: str, kind: str) -> None: ...

    def publish_many(self, turns: Sequence[tuple[str, str, str]]) -> None: ...


class Fleet(FleetReports):
    """One fleet: a Redis, a personas root, a broker. Thread-safe; share one per process."""

    def __init__(
        self,
        settings: Settings,
        *,
        client: redis.Redis | None = None,
        publisher: Publisher,
        clock: Clock | None = None,
        server_clock: bool = False,
    ) -> None:
        """``server_clock``: take wall time from Redis (:class:`ServerClock`), as beat does;
        else ``clock`` (default the host's)."""
        self.settings = settings
        self.client: redis.Redis = client or fleet_client(settings)
        self.clock: Clock = ServerClock(self.client) if server_clock else clock or SystemClock()
        self.keys = Keys(settings.key_prefix)
        self.registry = PersonaRegistry(settings.personas)
        #: The MCP servers a persona's ``use`` is checked against at the door (post, revive):
        #: this process's SOULFLEET_MCP_CONFIG, unless its owner knows the workers' better (the
        #: CLI sets those the running `up` gave its workers); None skips that check.
        self.mcp_servers: Mapping[str, FleetServer] | None = settings.mcp_servers
        #: The model defaults ``status`` names a persona's models by: this process's, unless
        #: its owner knows the fleet's (the CLI sets those beat recorded).
        self.model_defaults = ModelDefaults.of(settings)
        self.publisher: Publisher = publisher
        self.lanes = Lanes(
            self.client,
            self.keys,
            inbox_max=settings.inbox_max,
            item_max_bytes=settings.item_max_bytes,
            lease_ttl=settings.lease_ttl,
            max_attempts=settings.max_attempts,
            beats_max=settings.beats_max,
            beat_max_bytes=settings.beat_max_bytes,
            reply_ttl=settings.reply_ttl,
            # Items of one turn hold at most a quarter of its token budget (4 bytes a token):
            # the soul, the history and the answers need the rest.
            drain_max_bytes=settings.turn_max_tokens,
            clock=self.clock,
        )
        self._beats = Beats(self.client, self.keys)
        #: beat's sweep writes a claimed batch through here (one script call per batch)
        self.sweeps = SweepWrites(self.client, self.keys)
        model = settings.model
        self.breaker = Breaker(
            self.client,
            self.keys,
            window=settings.breaker_window,
            min_calls=settings.breaker_min_calls,
            failure_ratio=settings.breaker_failure_ratio,
            probe_interval=settings.breaker_probe_interval,
            # One probe may take every try of one call; then its verdict is overdue.
            probe_ttl=model.timeout * (model.retries + 1) + 5.0,
            clock=self.clock,
        )
        self.backoff = Backoff(settings.retry_base, settings.retry_max)
        self.recovery = Recovery(self.lanes, self.breaker, claim_ttl=settings.claim_ttl)
        self.ledger = UsageLedger(
            self.client, self.keys, days=settings.usage_days, clock=self.clock
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        publisher: Publisher,
        clock: Clock | None = None,
        server_clock: bool = False,
    ) -> Fleet:
        return cls(settings, publisher=publisher, clock=clock, server_clock=server_clock)

    # -- inbound ------------------------------------------------------------------------
    def post(
        self,
        persona: str,
        text: str,
        *,
        sender: str = "external",
        channel: str = "api",
        wake: bool = True,
        reply: bool = False,
        trusted: bool = False,
        new_session: bool = False,
        on_posted: Callable[[PostOutcome], None] | None = None,
        on_sending: Callable[[], None] | None = None,
    ) -> PostOutcome:
        """Put ``text`` in the persona's inbox; with ``wake``, queue a turn if it is idle.

        Trust is the HOST's statement, never read from ``sender`` (provenance only): the item
        renders inside the persona's UNTRUSTED block unless ``trusted=True``. Pass it for what
        the persona's own side sends (its operator, its own turns, its dreamer); never for text
        that came from outside, whatever address it claims.

        ``new_session`` ends the persona's session with the post (:meth:`reset_session`, in
        the same step: a refused post ends nothing), so the turn that reads ``text`` starts a
        new one. ``on_posted(outcome)`` runs the moment the item
        is in the inbox, before its turn is published (a caller interrupted after it knows the
        item is kept: posting it again would be a duplicate); ``on_sending()`` right before the
        item is sent to Redis, once every check at the door has passed (between the two the
        caller cannot tell whether the item was kept: the CLI holds Ctrl-C there).

        Raises :class:`~workers.fleet.errors.UnknownPersona`,
        :class:`~workers.fleet.errors.InboxFull`
        (nothing is dropped: the sender keeps the item), ``ItemTooLarge``, or the
        :class:`~workers.persona.errors.PersonaError` its files would fail its turn with (an
        invalid persona.toml, a SOUL.md that is a directory, an unknown model spec): its lane
        would only be dead-lettered, so the item is refused while its sender still has it.
        """
        name = self.registry.resolve(persona)
        self.check(name)
        self._refuse_if_stopped(name)
        item = InboxItem(
            text=text,
            sender=sender,
            channel=channel,
            id=uuid.uuid4().hex,
            at=self.clock.time(),
            reply=reply,
            trusted=trusted,
        )
        if on_sending is not None:
            on_sending()
        try:
            outcome = self.lanes.post(name, item, wake=wake, new_session=new_session)
        except InboxFull as full:
            if full.drain_turn is not None:  # refused, but the idle lane now drains its inbox
                self._publish_queued(name, full.drain_turn, "interactive")
            raise
        if on_posted is not None:
            on_posted(outcome)
        if outcome.turn_id is not None and outcome.turn_kind is not None:
            refused = self._publish_queued(name, outcome.turn_id, outcome.turn_kind)
            if refused is not None:
                # The item is in the inbox and the turn queued: raising would tell the sender
                # to post again (a duplicate). The reaper's next pass sends the wake-up.
                why, marked = refused
                return replace(outcome, unsent=why, resend_soon=marked == 1)
        return outcome

    def send(self, turns: Sequence[tuple[str, str, str]]) -> None:
        """Publish ``turns``; when the broker refuses, hand them to the reaper's next pass
        (not its 600 s wait for a lost message), then raise as before."""
        try:
            self.publisher.publish_many(turns)
        except RedisUnavailable as exc:
            self.lanes.unsent([(lane, turn_id) for lane, turn_id, _ in turns], str(exc))
            raise

    def _publish_queued(self, lane: str, turn_id: str, kind: str) -> tuple[str, int] | None:
        """Publish a turn a post queued. One the broker refuses goes to the reaper's next pass
        (not its 600 s wait for a lost message): returned as ``(why, how many were marked)``;
        None when sent. Interrupted mid-publish (Ctrl-C, a caller's exception), the turn is
        queued and maybe unsent: handed over the same way, and the interruption re-raised."""
        try:
            self.publisher.publish(lane, turn_id, kind)
        except RedisUnavailable as exc:
            return str(exc), self.lanes.unsent([(lane, turn_id)], str(exc))
        except BaseException:
            with contextlib.suppress(Exception):
                self.lanes.unsent([(lane, turn_id)], "publish interrupted")
            raise
        return None

    def _refuse_if_stopped(self, name: str) -> None:
        """A persona whose budget is used up with ``on_exceed = "stop"`` would refuse the turn
        and lose the item: refuse the post instead, while its sender still has it."""
        refusal = self.budget_refusal(name, "interactive")
        if refusal is not None:
            budget, spent = refusal
            resets = next_reset(budget, self.clock.time())
            raise BudgetStopped(name, spent, budget.daily_tokens or 0, resets)

    def budget_refusal(self, name: str, kind: str) -> tuple[DailyBudget, int] | None:
        """The persona's daily budget and today's spend when that budget refuses turns of
        ``kind`` now (used up, and its ``on_exceed`` covers them); None otherwise. Redis is
        read only when it could."""
        budget = persona_budget(self.registry.home(name), self.settings)
        if budget.daily_tokens is None or (
            budget.on_exceed != "stop" and kind not in BACKGROUND_KINDS
        ):
            return None
        spent = self.ledger.spent(name, self.ledger.today(budget.timezone))
        return (budget, spent) if budget_refuses(budget, kind, spent) else None

    def last_pass_if_nothing_new(self, name: str) -> float | None:
        """When the persona's last dream pass ended, if nothing was written since (its next
        pass will be skipped, ``nothing_new``); None when a pass would run."""
        lane = self.registry.lane_of(name, "dream")
        with redis_errors(self.client):
            raw = self.client.hget(self.keys.lane(lane), LAST_PASS)
        times = pass_times(raw)
        if times is None:
            return None
        ended, began = times
        return ended if nothing_new(self.registry.home(name), name, ended, began) else None

    def tick(self, persona: str, kind: str = "heartbeat") -> TickOutcome:
        """What beat does: fold one tick into the lane; queue a turn only if it is idle."""
        name = self.registry.resolve(persona)
        lane = self.registry.lane_of(name, kind)
        return self.tick_lanes([(lane, "dream" if kind == "dream" else "heartbeat")])[0]

    def dream(self, persona: str) -> TickOutcome:
        """Wake the persona's dreamer for one pass now (its own lane and queue)."""
        return self.tick(persona, kind="dream")

    def tick_lanes(self, pairs: Sequence[tuple[str, str]]) -> list[TickOutcome]:
        """Tick many ``(lane, kind)`` pairs in pipelined round trips and publish what queued."""
        outcomes = self.lanes.tick_many(pairs)
        self.send(
            [
                (o.lane, o.turn_id, o.turn_kind)
                for o in outcomes
                if o.outcome == "queued" and o.turn_id is not None and o.turn_kind is not None
            ]
        )
        return outcomes

    def run(
        self,
        persona: str,
        prompt: str,
        *,
        new_session: bool = False,
        timeout: float = 300.0,
        on_wait: Callable[[float], None] | None = None,
        trusted: bool = False,
        on_posted: Callable[[PostOutcome], None] | None = None,
        on_sending: Callable[[], None] | None = None,
    ) -> RunReply:
        """Post ``prompt`` as an interactive item and wait for the turn that answers it.

        The turn continues the persona's session (it sees the conversation so far);
        ``new_session`` starts a new one first. ``on_wait(seconds waited)`` is called every
        couple of seconds while no answer came (the CLI uses it to say when no worker consumes
        the queue); ``on_posted(outcome)`` once the prompt is in the inbox (from then on its
        turn goes on whether or not this call waits for it), ``on_sending()`` right before it
        is sent (:meth:`post`). Like every post, the prompt is untrusted unless ``trusted``.
        """
        outcome = self.post(
            persona,
            prompt,
            sender="cli",
            channel="run",
            wake=True,
            reply=True,
            new_session=new_session,
            trusted=trusted,
            on_posted=on_posted,
            on_sending=on_sending,
        )
        started = time.monotonic()
        deadline = started + timeout
        name = outcome.lane
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no answer from {name!r} within {timeout:.0f}s; "
                    f"`soulfleet status {name}` shows what its lane is doing"
                )
            wait = min(remaining, 2.0)
            reply_key = self.keys.reply(outcome.item_id)
            try:
                if on_wait is not None:
                    on_wait(time.monotonic() - started)
                popped = self._call(
                    lambda key=reply_key, wait=wait: self.client.blpop([key], timeout=wait)
                )
                status = {} if popped else self.lanes.status(name)
            except RedisUnavailable:
                # The prompt is posted and its turn goes on without us; its reply is pushed
                # to Redis (kept SOULFLEET_REPLY_TTL) once Redis is back: a blip shorter than
                # the timeout is waited out (on_wait's own reads of Redis included).
                if time.monotonic() + 1.0 >= deadline:
                    raise
                time.sleep(1.0)
                continue
            if popped:
                return RunReply.from_json(popped[1])
            if status.get("state") == "dead":
                raise LaneDeadLettered(name, str(status.get("last_error") or "unknown error"))

    # -- operations ---------------------------------------------------------------------
    def reset_session(self, persona: str) -> int:
        """End the persona's session: its next turn composes a fresh soul and starts with no
        history (a turn running now finishes, but adds nothing). Returns the reset epoch."""
        name = self.registry.resolve(persona)
        return self.lanes.reset_session(name)

    def revive(
        self, persona: str, *, dreamer: bool = False, drop_kept: bool = False
    ) -> TickOutcome:
        """Take a dead-lettered lane back into service (its kept items run first, or with
        ``drop_kept`` are dropped: see :meth:`Lanes.revive`).

        Raises the :class:`~workers.persona.errors.PersonaError` its files would fail its turn
        with, as :meth:`post` does: a lane revived before its persona is fixed would only be
        dead-lettered again, and lose the attempt's record of why."""
        name = self.registry.resolve(persona)
        self.check(name)
        lane = self.registry.lane_of(name, "dreamer" if dreamer else "persona")
        outcome = self.lanes.revive(lane, drop_kept=drop_kept)
        if outcome.outcome == "queued" and outcome.turn_id and outcome.turn_kind:
            self.send([(lane, outcome.turn_id, outcome.turn_kind)])
        return outcome

    def revive_dead(
        self, *, reason: str | None = None
    ) -> tuple[list[TickOutcome], list[tuple[str, str]]]:
        """:func:`workers.fleet.dead_letters.revive_dead` on this fleet."""
        return dead_letters.revive_dead(self, reason=reason)

    def requeue_unindexed(self) -> list[TickOutcome]:
        """:func:`workers.fleet.dead_letters.requeue_unindexed` on this fleet."""
        return dead_letters.requeue_unindexed(self)

    def orphaned_dead(self) -> list[str]:
        """:func:`workers.fleet.dead_letters.orphaned_dead` on this fleet."""
        return dead_letters.orphaned_dead(self)

    def orphaned_retrying(self) -> list[str]:
        """:func:`workers.fleet.dead_letters.orphaned_retrying` on this fleet."""
        return dead_letters.orphaned_retrying(self)

    def forget_gone(self) -> list[tuple[str, int]]:
        """:func:`workers.fleet.dead_letters.forget_gone` on this fleet."""
        return dead_letters.forget_gone(self)

    def check(self, name: str) -> None:
        """Raise what persona ``name``'s files would fail its turn with (post, revive): a
        permanent failure only. A transient one (a Python tool's import still running at its
        limit) is logged and let through: the lane's turns retry it, and refusing would lose
        the item its sender cannot tell from an invalid persona."""
        try:
            check_persona(
                self.registry.home(name), self.settings.model, mcp_servers=self.mcp_servers
            )
        except PersonaError as exc:
            if not exc.retryable:
                raise
            _log.warning("persona.check_transient", persona=name, error=str(exc))

    def recover(self) -> list[Repair]:
        """beat's fast pass: queue retries whose backoff is over, re-publish turns whose
        claiming worker died, resume lanes a closed breaker deferred; publish them all."""
        repairs: list[Repair] = []
        recovery = self.recovery
        for step in (recovery.release_due, recovery.reap_claims, recovery.resume_deferred):
            # Sent step by step: a step that fails (Redis gone mid-pass) must not strand the
            # lanes an earlier one already queued until the 600 s reaper.
            done = step()
            self.send([(r.lane, r.turn_id, r.kind) for r in done])
            repairs.extend(done)
        return repairs

    def reap(self) -> list[Repair]:
        """Re-queue stranded lanes (lost messages, dead workers) and publish their turns."""
        repairs = self.lanes.reap(queued_after=self.settings.reap_queued_after)
        # A probe whose worker died held its provider's slot for the probe ttl: free it now,
        # before the lane's turn is sent again (which may take the probe afresh).
        dead = [r.lane for r in repairs if r.reason == "lease_expired"]
        try:
            self.breaker.release_probes(dead)
        except (RedisUnavailable, redis.RedisError) as exc:  # it frees itself at its ttl
            _log.warning("breaker.release_failed", lanes=len(dead), error=str(exc))
        self.send([(r.lane, r.turn_id, r.kind) for r in repairs])
        return repairs

    def ping(self) -> None:
        """Raise :class:`RedisUnavailable` (URL without its password) if Redis is down."""
        self._call(self.client.ping)

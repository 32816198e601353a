"""How a started turn ends when it does not commit a model's answer (and the note a turn that
ended short leaves for ``soulfleet status``), and the lines every turn logs: ``turn.start``
and ``turn.end`` (with the metrics), a failure by kind (retried with backoff, or
dead-lettered), a deferral behind an open provider breaker, a refusal by the spend guard. Each
ending first stops renewing the turn's lease (:meth:`Endings.release_lease`): the script that
ends the turn deletes it, and a renewal landing in between must not read as a loss.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from workers import metrics
from workers.fleet import Fleet
from workers.fleet.breaker import counts_against_provider
from workers.fleet.errors import FleetError, ProviderPaused, classify
from workers.fleet.lease import LeaseHandle, Renewer
from workers.fleet.outcomes import StartOutcome
from workers.fleet.spend import Refusal
from workers.logs import monotonic_wall_time
from workers.persona.checkup import input_over_budget_remedy
from workers.persona.errors import causes
from workers.persona.loop import RunResult
from workers.persona.waits import waiting
from workers.settings import Settings
from workers.turn.claims import START_REDIS_WAIT, waiting_for_redis
from workers.turn.report import TurnReport

__all__ = ["END_REDIS_WAIT", "Endings", "incomplete_note", "input_over_budget", "retry_after"]

T = TypeVar("T")

#: How long a turn's end (finish, fail, defer) waits for a Redis that is down before the task
#: fails: as long as its start would. Giving up at once threw away what the turn had paid for
#: (the lane sat ``running`` until its lease lapsed, and the reaper's re-run paid again).
END_REDIS_WAIT = START_REDIS_WAIT

_log = structlog.get_logger("soulfleet.turn")


class Endings:
    """The endings and turn lines of one worker process. Thread-safe (one per executor)."""

    def __init__(
        self,
        settings: Settings,
        fleet: Fleet,
        renewer: Renewer,
        *,
        worker_id: str,
        baton_waited: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.renewer = renewer
        self.worker_id = worker_id
        # The running turn's lease handle, per pool thread.
        self._held = threading.local()
        # The running turn's wait for the worker's baton so far (None: no baton).
        self.baton_waited = baton_waited

    def ending(self, step: Callable[[], T]) -> T:
        """Run one of the scripts that end a started turn, waiting out a Redis that is down
        (a restart, a failover) for up to :data:`END_REDIS_WAIT` seconds."""
        return waiting_for_redis(
            step,
            clock=self.fleet.clock,
            wait=END_REDIS_WAIT,
            event="turn.end_waiting_for_redis",
        )

    def hold(self, handle: LeaseHandle | None) -> None:
        """The lease the calling thread's turn runs under (None once it returned)."""
        self._held.lease = handle

    def release_lease(self) -> None:
        """Stop renewing the turn's lease just before the script that ends it (finish, fail,
        defer): a renewal pass landing between that script and the turn's return would find
        the lease gone and report a loss that is really the turn's own end."""
        handle = getattr(self._held, "lease", None)
        if handle is not None:
            self.renewer.unregister(handle)

    def follow_up(self, lane: str, turn_id: str, kind: str) -> None:
        """Publish the turn a commit or a failure queued (``Lanes.finish``/``Lanes.fail`` with
        this worker as its ``publisher``), then drop the claim taken for it: were this worker
        killed in between, the claim would lapse and beat would re-publish the turn within
        seconds."""
        with waiting():  # through Celery's own broker connection, which retries a lost one
            self.fleet.publisher.publish(lane, turn_id, kind)
        try:
            self.fleet.lanes.unclaim(lane, turn_id, self.worker_id)
        except FleetError as exc:  # the claim lapses by itself: at worst one duplicate message
            _log.warning("turn.unclaim_failed", follow_up=turn_id, error=str(exc))

    def fail(
        self,
        lane: str,
        turn_id: str,
        started: StartOutcome,
        error: str,
        began: float,
        *,
        cause: BaseException | None = None,
        provider: str | None = None,
        model: str | None = None,
    ) -> TurnReport:
        ended_at = monotonic_wall_time()
        kind = classify(cause) if cause is not None else "unknown"
        if provider is not None and cause is not None and self.breaker_holds(provider, cause):
            return self.defer(lane, turn_id, started, began, provider=provider, why=error)
        settings = self.settings
        self.release_lease()
        wait_at_least = retry_after(cause)
        failed = self.ending(
            lambda: self.fleet.lanes.fail(
                lane,
                started.fence,
                error=error[:2000],
                kind=kind,
                backoff=(settings.retry_base, settings.retry_max),
                retry_for=settings.retry_for,
                publisher=self.worker_id,
                claim_ttl=settings.claim_ttl,
                wait_at_least=wait_at_least,
            ),
        )
        if failed.dead:
            _log.error(
                "turn.dead_lettered", attempts=started.attempt, failure=kind, reason=failed.reason
            )
        elif failed.retry_turn_id and failed.kind:
            self.follow_up(lane, failed.retry_turn_id, failed.kind)
        self.end(
            lane,
            turn_id,
            started,
            "error",
            began,
            ended_at=ended_at,
            error=error,
            failure=kind,
            dead=failed.dead,
            retry_at=failed.retry_at,
            model=model,
        )
        extra = {"error": error, "dead": failed.dead, "failure": kind, "reason": failed.reason}
        return TurnReport(lane, turn_id, "error", extra=extra)

    def defer(
        self,
        lane: str,
        turn_id: str,
        started: StartOutcome,
        began: float,
        *,
        provider: str,
        why: str,
    ) -> TurnReport:
        ended_at = monotonic_wall_time()
        self.release_lease()
        self.ending(
            lambda: self.fleet.lanes.defer(lane, started.fence, provider=provider, why=why[:2000]),
        )
        _log.info("turn.deferred", provider=provider, error=why[:300])
        self.end(lane, turn_id, started, "deferred", began, ended_at=ended_at, error=why)
        return TurnReport(lane, turn_id, "deferred", extra={"error": why})

    def breaker_holds(self, provider: str, cause: BaseException) -> bool:
        """Whether this failure is the provider breaker's to wait out (defer, not fail)."""
        if isinstance(cause, ProviderPaused):
            return True
        return counts_against_provider(cause) and self.fleet.breaker.is_open(provider)

    def end(
        self,
        lane: str,
        turn_id: str,
        started: StartOutcome,
        status: str,
        began: float,
        *,
        ended_at: float | None = None,
        **fields: Any,
    ) -> None:
        seconds = time.monotonic() - began
        metrics.TURNS.labels(kind=started.kind, status=status).inc()
        metrics.TURN_SECONDS.labels(kind=started.kind).observe(seconds)
        baton_wait = self.baton_waited()
        if baton_wait is not None:
            metrics.BATON_WAIT.observe(baton_wait)
            fields["baton_wait"] = round(baton_wait, 4)
        _log.info(
            "turn.end",
            lane=lane,
            turn_id=turn_id,
            fence=started.fence,
            kind=started.kind,
            ticks=started.ticks,
            items=len(started.items),
            item_ids=[item.id for item in started.items],
            status=status,
            seconds=round(seconds, 4),
            at=ended_at if ended_at is not None else monotonic_wall_time(),
            **{k: v for k, v in fields.items() if v is not None},
        )

    def started(self, started: StartOutcome, kind: str, spec: str | None) -> None:
        _log.info(
            "turn.start",
            fence=started.fence,
            kind=started.kind,
            model_kind=kind,
            model=spec,
            ticks=started.ticks,
            items=len(started.items),
            recovered=started.recovered,
            attempt=started.attempt,
            worker=self.worker_id,
            at=monotonic_wall_time(),
        )

    def refuse(
        self,
        lane: str,
        turn_id: str,
        started: StartOutcome,
        refusal: Refusal,
        began: float,
        *,
        kind: str,
        model: str,
    ) -> TurnReport:
        """End the turn without a model call: background work is skipped, a conversation
        refused (whoever waits for a reply gets the reason as its text)."""
        metrics.TURNS_SKIPPED.labels(kind=kind, reason=refusal.reason).inc()
        _log.info(
            "turn.skipped",
            reason=refusal.reason,
            status=refusal.status,
            detail=refusal.detail,
            kind=kind,
            item_ids=[item.id for item in started.items],
        )
        ended_at = monotonic_wall_time()
        text = refusal.detail if refusal.status == "refused" else ""
        self.release_lease()
        finished = self.ending(
            lambda: self.fleet.lanes.finish(
                lane,
                started.fence,
                status=refusal.status,
                text=text,
                reply_ids=[item.id for item in started.items if item.reply],
                reply_extra={"reason": refusal.reason},
                publisher=self.worker_id,
                claim_ttl=self.settings.claim_ttl,
            ),
        )
        if finished.follow_up_turn_id and finished.follow_up_kind:
            self.follow_up(lane, finished.follow_up_turn_id, finished.follow_up_kind)
        self.end(
            lane,
            turn_id,
            started,
            refusal.status,
            began,
            ended_at=ended_at,
            reason=refusal.reason,
            model=model,
            follow_up=finished.follow_up_turn_id,
        )
        return TurnReport(lane, turn_id, refusal.status, text, finished.follow_up_turn_id)


def input_over_budget(result: RunResult) -> bool:
    """The turn ended before any model call: its input alone was over the token budget."""
    return result.status == "incomplete" and result.limit == "max_tokens" and not result.model_calls


def incomplete_note(result: RunResult, persona: str, *, dreamer: bool = False) -> str:
    """What an operator should know about a turn that ended short ("" for any other): a turn
    stopped by a budget answered its items with what it had, and one whose input alone was
    over the token budget made no model call at all, which repeats every turn until the soul
    or the session shrinks."""
    if result.status != "incomplete":
        return ""
    if input_over_budget(result):
        return (
            "incomplete: the input alone (soul + session) is over the turn's token budget, so "
            f"no model call was made; {input_over_budget_remedy(persona, dreamer=dreamer)}"
        )
    if result.limit is None:
        return "incomplete"
    return (
        f"incomplete: stopped by its {result.limit} limit (SOULFLEET_TURN_{result.limit.upper()})"
    )


def retry_after(cause: BaseException | None) -> float:
    """How long the provider asked to be left alone (a model error's ``retry_after`` in the
    failure's causes), or 0."""
    for current in causes(cause):
        wait = getattr(current, "retry_after", None)
        if isinstance(wait, (int, float)) and wait > 0:
            return float(wait)
    return 0.0

"""How a turn uses its lane's session: plan at the start, conclude at the end (issue 11).

The one recipe every runtime shares (the library's ``run``, the in-process heartbeat driver
and the fleet's turn executor); only where the pointer lives differs (see
:mod:`workers.persona.session_files`).

:func:`plan_turn`, before the first model call:

* the committed state still going on (same reset epoch, not idle, no daily reset passed):
  continue it, its frozen soul and its history, compacted first if over budget;
* otherwise a new session: the soul is composed NOW and frozen; no history. A session whose
  frozen soul alone is over ``session.max_tokens`` (or the turn's token budget) is not
  continued either (reason ``soul_over_budget``): no compaction could make its turns fit;
  nor is one that compaction could not bring within the turn's budget (``over_turn_budget``).
  Its id is derived from the ended session's id
  (:func:`~workers.persona.session.next_session_id`), so a retry of the turn, and silent beats
  before the session's first real turn, share one transcript.

:meth:`SessionPlan.conclude`, after the loop, decides what the session becomes:

* a silent heartbeat turn (ticks only, reply contains ``HEARTBEAT_OK``) adds nothing: no
  messages, no new session, not even a fresher idle clock (it is in the transcript for audit,
  and counted in the beats metric). The one exception is a lane with no session at all: it
  gets an empty one, so the next beats have a transcript to share instead of one file each;
* anything else is appended: the (possibly compacted) history plus the turn's messages;
* one-shot runs and dream passes are ephemeral: a fresh session each, never stored.

The caller commits the returned state only if the turn did not fail (``status != "error"``),
and only through its fenced/compare-and-set pointer move.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import structlog

from workers.persona.compaction import Compaction, Summaries, compact
from workers.persona.loop import Budget, RunResult
from workers.persona.messages import Message
from workers.persona.models import Model
from workers.persona.models.spec import provider_of
from workers.persona.session import (
    COMPACTION_FAILED,
    Dialect,
    Pointer,
    SessionConfig,
    SessionState,
    estimate_tokens,
    new_session_id,
    next_session_id,
)

__all__ = ["SessionPlan", "dialect_of", "ephemeral_plan", "plan_turn", "within_turn"]

_log = structlog.get_logger("soulfleet.session")

Compose = Callable[[], tuple[str, list[str]]]


def dialect_of(model: Model) -> Dialect:
    """The wire dialect compaction must respect for ``model``."""
    return "anthropic" if provider_of(model) == "anthropic" else "openai"


@dataclass(frozen=True)
class SessionPlan:
    """What one turn runs with, and where its messages go."""

    lane: str
    session_id: str
    soul: str
    sections: tuple[str, ...]
    history: tuple[Message, ...]
    pointer: Pointer
    base: SessionState | None
    started_at: float
    new: bool
    # continued | first | pointer_lost | idle | daily | reset | missing | soul_over_budget
    # | over_turn_budget
    # | ephemeral
    reason: str
    compaction: Compaction | None = None
    persist: bool = True
    #: When the turn was planned (its start, on the turn's clock): what it stamps as the
    #: session's last turn, so a turn running across ``daily_reset`` still lets the next one
    #: reset (stamped at its commit, it skipped that day's reset).
    planned_at: float = 0.0
    #: The session is within its budget (no compaction was needed): a compaction failure it
    #: recorded is over.
    under_budget: bool = False

    @property
    def compacted(self) -> bool:
        """Whether this turn's history is a compaction's (not only a paid, empty attempt)."""
        return self.compaction is not None and self.compaction.applied

    def left_of(self, budget: Budget) -> Budget:
        """What ``budget`` leaves the turn's own loop once this plan's compaction (a model call
        made before the loop) is counted: one call fewer, its tokens fewer."""
        if self.compaction is None or not self.compaction.charged:
            return budget
        return replace(
            budget,
            max_model_calls=max(0, budget.max_model_calls - 1),
            max_tokens=max(0, budget.max_tokens - self.compaction.usage.total_tokens),
        )

    def charge(self, result: RunResult) -> RunResult:
        """``result`` with the compaction's model call counted in its usage and calls."""
        if self.compaction is None or not self.compaction.charged:
            return result
        return replace(
            result,
            usage=self.compaction.usage + result.usage,
            model_calls=result.model_calls + 1,
        )

    def conclude(self, messages: Sequence[Message], *, silent_beat: bool) -> SessionState | None:
        """The state to commit after a turn that did not fail, or None: commit nothing."""
        now = self.planned_at
        if not self.persist:
            return None
        if silent_beat and self.base is not None:
            if self.compacted:
                # The summary was paid for: keep it (the beat's own exchange still goes, and
                # the session's last turn stays the last one that said something).
                return self._noted(replace(
                    self.base, messages=self.history, compactions=self.base.compactions + 1
                ))  # fmt: skip
            noted = self._noted(self.base)
            # The beat leaves no exchange; a failure is written when it starts or ends, not at
            # every silent beat of an over-budget session (its text varies: a time left, a
            # response's excerpt).
            changed = (COMPACTION_FAILED in noted.extra) != (COMPACTION_FAILED in self.base.extra)
            return noted if changed else None
        if self.new or self.base is None:
            state = SessionState(
                id=self.session_id,
                lane=self.lane,
                epoch=self.pointer.epoch,
                started_at=self.started_at,
                last_turn_at=self.started_at,
                soul=self.soul,
                sections=self.sections,
            )
        else:
            state = self.base
        if silent_beat:
            return state
        if self.compacted:
            state = replace(state, compactions=state.compactions + 1)
        return self._noted(state.appended(messages, now=now, history=self.history))

    def _noted(self, state: SessionState) -> SessionState:
        """``state`` saying how this turn's compaction went: a failure is kept (since when, and
        the latest why) while the session stays over its budget, so `session show` tells a
        session that grows past it because its summaries fail (they were in the worker's log
        only); a summary applied, or a turn under budget again (a raised max_tokens), ends it."""
        kept = state.extra.get(COMPACTION_FAILED)
        failed = self.compaction.failed if self.compaction is not None else ""
        ended = self.compacted or (self.compaction is None and self.under_budget)
        if not failed and (kept is None or not ended):
            return state
        extra = {k: v for k, v in state.extra.items() if k != COMPACTION_FAILED}
        if failed:
            since = kept.get("at") if isinstance(kept, dict) else None
            at = since if isinstance(since, int | float) else self.planned_at
            extra[COMPACTION_FAILED] = {"at": at, "error": failed}
        return replace(state, extra=extra)


def within_turn(config: SessionConfig, turn_tokens: int | None) -> SessionConfig:
    """``config`` as compaction applies it under a turn budget of ``turn_tokens``: a session is
    compacted once over half that budget when that comes before ``max_tokens`` (the tail kept
    shrinks to match). Compacted only at ``max_tokens``, a session past the turn's budget
    left every turn ending before its model call, for good (SOULFLEET_TURN_MAX_TOKENS below
    ``session.max_tokens``); half leaves the turn room for its own calls."""
    if turn_tokens is None or turn_tokens // 2 >= config.max_tokens:
        return config
    limit = max(1, turn_tokens // 2)
    return replace(config, max_tokens=limit, keep_tail=min(config.tail_tokens, limit // 2))


def ephemeral_plan(lane: str, compose: Compose, *, now: float) -> SessionPlan:
    """A one-off session: fresh soul, no history, never stored (one-shot runs, dream passes)."""
    soul, found = compose()
    return SessionPlan(
        planned_at=now,
        lane=lane,
        session_id=new_session_id(),
        soul=soul,
        sections=tuple(found),
        history=(),
        pointer=Pointer(),
        base=None,
        started_at=now,
        new=True,
        reason="ephemeral",
        persist=False,
    )


def plan_turn(
    *,
    lane: str,
    pointer: Pointer,
    base: SessionState | None,
    compose: Compose,
    config: SessionConfig,
    now: float,
    incoming: str,
    model: Model,
    turn_tokens: int | None = None,
    summaries: Summaries | None = None,
    pointer_lost: bool = False,
) -> SessionPlan:
    """Continue ``base`` or start a new session (module doc); compaction happens here.

    ``pointer_lost``: the pointer is unset but the lane kept sessions on disk (its Redis state
    is gone): the new session says so (reason ``pointer_lost``, a warning), not ``first``.

    ``turn_tokens`` is the turn's token budget (``Budget.max_tokens``): a frozen soul over it,
    as over ``session.max_tokens``, is not continued. ``summaries``: where a paid summary is
    kept for this turn's retry (:mod:`workers.persona.summary_cache`)."""
    reason: str | None
    if base is None and pointer.state is None and pointer_lost:
        reason = "pointer_lost"
        _log.warning(
            "session.pointer_lost",
            lane=lane,
            error="the lane's Redis state is gone (Redis lost its data, or evicted the lane's "
            "hash): which session was current is not known",
            hint="its conversation starts over; the earlier one stays readable in its "
            "transcripts/ (transcript_search finds it); see the runbook: Redis down or restarted",
        )
    elif base is None:
        reason = "first" if pointer.state is None else "missing"
    elif base.epoch != pointer.epoch:
        reason = "reset"
    else:
        reason = config.expired(base, now)
        limit = config.max_tokens if turn_tokens is None else min(config.max_tokens, turn_tokens)
        if reason is None and estimate_tokens((), base.soul) > limit:
            # The session's soul was frozen at its start: alone over the session's or the
            # turn's budget, no compaction can make a turn fit, and every turn would end before
            # its model call (a MEMORY.md trimmed since would never be seen). A new session
            # reads the files as they are now.
            reason = "soul_over_budget"
    if reason is not None:
        return _new_session(lane, pointer, base, compose, config, now, reason)
    assert base is not None
    applied = within_turn(config, turn_tokens)
    compaction = compact(
        base.messages,
        system=base.soul,
        incoming=incoming,
        config=applied,
        model=model,
        dialect=dialect_of(model),
        summaries=summaries,
    )
    history = base.messages if compaction is None else compaction.history
    paid = 0 if compaction is None else compaction.usage.total_tokens
    needed = estimate_tokens(history, base.soul) + estimate_tokens([Message("user", incoming)])
    # compact() returns None both under its budget and when it skips an over-budget session
    # (a tail too big to keep, no valid split): only the first ends a recorded failure.
    under_budget = compaction is None and needed <= applied.max_tokens
    if turn_tokens is not None and needed > turn_tokens - paid:
        # Compaction could not bring the session within the turn's budget (a soul too large
        # for any valid tail to fit under half of it): continued, the turn would end before
        # its model call, and so would every later one as the session grew. A new session
        # (the soul and the incoming message) is what still fits.
        return _new_session(lane, pointer, base, compose, config, now, "over_turn_budget")
    return SessionPlan(
        planned_at=now,
        lane=lane,
        session_id=base.id,
        soul=base.soul,
        sections=base.sections,
        history=base.messages if compaction is None else compaction.history,
        pointer=pointer,
        base=base,
        started_at=base.started_at,
        new=False,
        reason="continued",
        compaction=compaction,
        under_budget=under_budget,
    )


def _new_session(  # noqa: PLR0917 (plan_turn's own arguments, passed on)
    lane: str,
    pointer: Pointer,
    base: SessionState | None,
    compose: Compose,
    config: SessionConfig,
    now: float,
    reason: str,
) -> SessionPlan:
    """A new session for ``reason``: the soul composed from the files as they are now."""
    soul, found = compose()
    if base is not None and config.idle_reset > 0:
        session_id = next_session_id(base.id)
    else:
        # "0s" keeps today's one conversation per turn; no base: nothing to derive from.
        session_id = new_session_id()
    _log.info("session.new", lane=lane, session=session_id, reason=reason)
    return SessionPlan(
        planned_at=now,
        lane=lane,
        session_id=session_id,
        soul=soul,
        sections=tuple(found),
        history=(),
        pointer=pointer,
        base=base,
        started_at=now,
        new=True,
        reason=reason,
    )

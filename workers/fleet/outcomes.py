"""Outcomes: what each lane transition did, as plain frozen values.

:class:`~workers.fleet.lanes.Lanes` returns these; the fleet, the turn runner and the beat's reaper
consume them. They live apart from ``Lanes`` because their readers need only the shapes, not a
Redis client or the Lua scripts, and because they are the contract between "a script ran" and
"the caller must now publish a turn": wherever an outcome carries a turn id, a turn was queued
and publishing it is the caller's job (the lanes never publish).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from workers.persona.inbox import InboxItem

__all__ = [
    "FailOutcome",
    "FinishOutcome",
    "PostOutcome",
    "Repair",
    "RunReply",
    "StartOutcome",
    "TickOutcome",
]


@dataclass(frozen=True, slots=True)
class PostOutcome:
    """What a post did. ``turn_id``/``turn_kind`` are set iff a turn must be published."""

    lane: str
    outcome: Literal["queued", "pending", "dead"]
    item_id: str
    depth: int
    turn_id: str | None = None
    turn_kind: str | None = None
    #: why the queued turn's wake-up could not be sent (the broker refused); None when it was
    #: sent. The item is kept either way: the reaper sends the turn at its next pass
    #: (SOULFLEET_REAP_INTERVAL) when ``resend_soon``, else once it has waited
    #: SOULFLEET_REAP_QUEUED_AFTER (Redis refused that mark too).
    unsent: str | None = None
    resend_soon: bool = False


@dataclass(frozen=True, slots=True)
class TickOutcome:
    """What a tick (or a revive) did. ``turn_id``/``turn_kind`` are set iff a turn was queued."""

    lane: str
    kind: str
    outcome: Literal["queued", "coalesced", "dead_lettered"]
    turn_id: str | None = None
    turn_kind: str | None = None
    dropped: int = 0  # items a revive with drop_kept dropped


@dataclass(frozen=True, slots=True)
class StartOutcome:
    """What a start did; only ``status == "started"`` means: run the turn with ``fence``."""

    status: Literal["started", "duplicate", "stale", "dead"]
    fence: int = 0
    items: list[InboxItem] = field(default_factory=list)
    ticks: int = 0
    recovered: int = 0
    attempt: int = 0
    kind: str = ""
    #: ``dead``: why the lane is dead-lettered; ``started``: the error of its last try while
    #: the lane is failing (failed since its last success), else "".
    error: str = ""
    failing_since_ms: int | None = None  # since when the lane has been failing (error set)
    #: The lane as this start found it (read in the same script, so no extra round trip):
    #: turns committed so far (the work id), the current session state and reset epoch, and
    #: when the dreamer's last pass ended (epoch ms; None: never).
    commits: int = 0
    session: str | None = None
    session_epoch: int = 0
    last_pass_ms: int | None = None
    #: When that pass began (epoch ms; None: never).
    last_pass_began_ms: int | None = None
    #: When the lane's state was created in Redis (epoch ms): with ``commits``, the work id.
    born_ms: int = 0


@dataclass(frozen=True, slots=True)
class FinishOutcome:
    """A committed turn. ``follow_up_*`` are set iff a follow-up turn must be published."""

    turn_id: str
    follow_up_turn_id: str | None = None
    follow_up_kind: str | None = None
    beat_id: str | None = None
    #: "unchanged", "committed" (the new session state is current) or "conflict" (a session
    #: reset happened during the turn, so its state was dropped)
    session: str = "unchanged"


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """A failed turn: dead-lettered (``reason``), queued again as ``retry_turn_id`` (publish
    it), or waiting in ``lanes:retry`` until ``retry_at`` (epoch s; beat releases it)."""

    dead: bool
    retry_turn_id: str | None
    kind: str
    retry_at: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Repair:
    """A stranded lane the reaper re-queued; the caller publishes ``turn_id`` on ``kind``."""

    lane: str
    reason: Literal[
        "lease_expired", "queued_too_long", "unsent", "claim_lapsed", "retry_due", "resumed"
    ]
    turn_id: str
    kind: str


@dataclass(frozen=True, slots=True)
class RunReply:
    """What a fleet turn answered to a ``run``."""

    text: str
    status: str
    turn_id: str
    usage: dict[str, int] | None = None
    limit: str | None = None
    #: why a turn ended without a model call (``budget``), with status skipped or refused
    reason: str | None = None

    @classmethod
    def from_json(cls, raw: str) -> RunReply:
        """The reply ``finish.lua`` (or a refusal) pushed for a ``run``, as JSON."""
        data: dict[str, Any] = json.loads(raw)
        usage = data.get("usage")
        return cls(
            text=str(data.get("text", "")),
            status=str(data.get("status", "")),
            turn_id=str(data.get("turn_id", "")),
            usage={str(k): int(v) for k, v in usage.items()} if isinstance(usage, dict) else None,
            limit=None if data.get("limit") is None else str(data["limit"]),
            reason=None if data.get("reason") is None else str(data["reason"]),
        )

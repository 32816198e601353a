"""Dead-lettered lanes in bulk: revive those whose persona can run again, name those whose
persona directory is gone, and forget those on purpose.

A lane is dead-lettered with its items kept (:mod:`workers.fleet.lanes`); one lane is revived
by :meth:`workers.fleet.Fleet.revive`. These functions take the :class:`~workers.fleet.Fleet`
whose lanes they work on (``Fleet.revive_dead`` and its siblings call them).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import redis

from workers.fleet.errors import FleetError, UnknownPersona
from workers.fleet.keys import Keys
from workers.fleet.lanes import Lanes
from workers.fleet.outcomes import TickOutcome
from workers.fleet.registry import PersonaRegistry
from workers.fleet.scripts import redis_errors


class Fleet(Protocol):
    """What these functions use of a :class:`workers.fleet.Fleet` (a Protocol: the host
    module imports this one)."""

    client: redis.Redis
    keys: Keys
    registry: PersonaRegistry
    lanes: Lanes

    def send(self, turns: Sequence[tuple[str, str, str]]) -> None: ...

    def check(self, name: str) -> None: ...

    def served_root(self) -> Path | None: ...


__all__ = [
    "Fleet",
    "check_error",
    "forget_gone",
    "orphaned_dead",
    "orphaned_retrying",
    "persona_exists",
    "requeue_unindexed",
    "revive_dead",
]


def revive_dead(
    fleet: Fleet, *, reason: str | None = None
) -> tuple[list[TickOutcome], list[tuple[str, str]]]:
    """Revive every dead-lettered lane whose persona still exists and passes the check
    :meth:`~workers.fleet.Fleet.post` makes, or only those whose last error contains
    ``reason`` (case-insensitive). Returns what was queued (and published), and the lanes left
    dead because their persona's files still fail that check, each with its error (whatever
    ``reason``): they would only be dead-lettered again."""
    lanes = [lane for lane in _dead(fleet) if persona_exists(fleet, lane)]
    errors_of: dict[str, str | None] = {}  # one check per persona, for both its lanes
    broken: list[tuple[str, str]] = []
    revivable: list[str] = []
    for lane in lanes:
        name, _role = fleet.registry.parse_lane(lane)
        if name not in errors_of:
            errors_of[name] = check_error(fleet, name)
        error = errors_of[name]
        if error is None:
            revivable.append(lane)
        else:
            broken.append((lane, error))
    lanes = revivable
    if reason is not None and lanes:
        with redis_errors(fleet.client):
            pipe = fleet.client.pipeline(transaction=False)
            for lane in lanes:
                pipe.hget(fleet.keys.lane(lane), "last_error")
            last_errors = pipe.execute()
        needle = reason.lower()
        lanes = [
            lane
            for lane, error in zip(lanes, last_errors, strict=True)
            if needle in str(error or "").lower()
        ]
    outcomes = [fleet.lanes.revive(lane) for lane in lanes]
    queued = [o for o in outcomes if o.outcome == "queued" and o.turn_id and o.turn_kind]
    fleet.send([(o.lane, str(o.turn_id), str(o.turn_kind)) for o in queued])
    return queued, broken


def requeue_unindexed(fleet: Fleet) -> list[TickOutcome]:
    """Put back every lane of the fleet's personas missing from the index its state is kept
    in (a Redis that evicted keys; ``revive.lua``): a queued one has its turn sent again; a
    running, retrying or deferred one goes back into its index, for the reaper, beat's release
    at its retry_at or the breaker's resume (a lane whose state changed meanwhile is left). No
    pass sees such a lane, so it stayed put for ever. Returns what was put back (``turn_id``
    set where a turn was sent)."""
    names = fleet.registry.names()
    lanes = [lane for name in names for lane in (name, fleet.registry.lane_of(name, "dreamer"))]
    states = fleet.lanes.status_many(lanes)
    found = [
        (lane, str(st.get("state") or ""), str(st.get("provider") or ""))
        for lane, st in zip(lanes, states, strict=True)
    ]
    outcomes = [
        fleet.lanes.revive(lane, reindex_only=True) for lane in fleet.lanes.unindexed(found)
    ]
    sent = [o for o in outcomes if o.outcome == "queued" and o.turn_id and o.turn_kind]
    fleet.send([(o.lane, str(o.turn_id), str(o.turn_kind)) for o in sent])
    return [o for o in outcomes if o in sent or o.kind.startswith("reindexed_")]


def orphaned_dead(fleet: Fleet) -> list[str]:
    """Dead-lettered lanes whose persona directory is gone (deleted or renamed). They are
    never revived by :func:`revive_dead` (they could only fail again); ``status`` names them
    so the dead count adds up, and :func:`forget_gone` removes them."""
    return [lane for lane in _dead(fleet) if not persona_exists(fleet, lane)]


def orphaned_retrying(fleet: Fleet) -> list[str]:
    """Lanes waiting out a retry whose persona directory is gone: a persona moved or removed
    mid-turn, retried within the edit grace (a move may be under way), dead-lettered after
    it. ``status`` lists its personas by directory, so it counted them and named none."""
    with redis_errors(fleet.client):
        lanes: list[str] = fleet.client.zrange(fleet.keys.retry, 0, -1)  # type: ignore[assignment]
    return [lane for lane in lanes if not persona_exists(fleet, lane)]


def forget_gone(fleet: Fleet) -> list[tuple[str, int]]:
    """Remove every dead-lettered lane whose persona directory is gone (see
    :func:`orphaned_dead`), with the items it kept: they could only fail again. Returns
    ``(lane, items dropped)`` per lane removed; a lane no longer dead by then is left alone
    (``forget.lua`` checks).

    Refuses (:class:`FleetError`, nothing removed) when this process may be looking at the
    wrong directory, where every persona would look gone: a personas root that is missing or
    holds no persona (a volume not mounted), or one other than the root beat's newest registry
    sync recorded for this Redis."""
    root = fleet.registry.root
    if not root.is_dir() or not fleet.registry.names():
        raise FleetError(
            f"refusing to forget: the personas root {root} is missing or holds no persona, "
            "so every persona would look gone (a volume not mounted, a wrong "
            "SOULFLEET_PERSONAS?); nothing was removed"
        )
    served = fleet.served_root()
    if served is not None and served.resolve() != root.resolve():
        raise FleetError(
            f"refusing to forget: this shell's personas root is {root}, but the fleet's beat "
            f"serves {served}; run it with SOULFLEET_PERSONAS={served}; nothing was removed"
        )
    forgotten: list[tuple[str, int]] = []
    for lane in orphaned_dead(fleet):
        dropped = fleet.lanes.forget(lane)
        if dropped is not None:
            forgotten.append((lane, dropped))
    return forgotten


def _dead(fleet: Fleet) -> list[str]:
    with redis_errors(fleet.client):
        lanes: list[str] = fleet.client.zrange(fleet.keys.dead, 0, -1)  # type: ignore[assignment]
    return lanes


def check_error(fleet: Fleet, name: str) -> str | None:
    """What persona ``name``'s files would fail its turn with, as one line; None when none."""
    try:
        fleet.check(name)
    except Exception as exc:  # whatever its files would fail its turn with
        return f"{type(exc).__name__}: {exc}"
    return None


def persona_exists(fleet: Fleet, lane: str) -> bool:
    """Whether the persona ``lane`` belongs to still has its directory under the root."""
    name, _role = fleet.registry.parse_lane(lane)
    try:
        fleet.registry.home(name)
    except UnknownPersona:
        return False
    return True

"""Queues by turn kind, so a nightly dreaming batch never starves a conversation.

Three queues, declared with kombu: ``<prefix>.interactive`` (posts and ``run``),
``<prefix>.heartbeat`` (heartbeat turns) and ``<prefix>.dream`` (dream passes). Every turn is the
same task (``soulfleet.turn``, never a persona-specific name: task names are metric labels in
Flower and Prometheus); the kind only picks the queue. A worker serves what ``-Q`` names, so a
deployment can dedicate workers to dreams (see the README's deployment section).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from kombu import Exchange, Queue

__all__ = ["KINDS", "TURN_TASK", "TurnKind", "declare_queues", "queue_name", "unknown_queues"]

TurnKind = Literal["interactive", "heartbeat", "dream"]
KINDS: tuple[TurnKind, ...] = ("interactive", "heartbeat", "dream")
TURN_TASK = "soulfleet.turn"


def queue_name(prefix: str, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown turn kind {kind!r}; expected one of {', '.join(KINDS)}")
    return f"{prefix}.{kind}"


def declare_queues(prefix: str) -> tuple[Queue, ...]:
    """One direct exchange per fleet; each queue bound by its own name."""
    exchange = Exchange(prefix, type="direct", durable=True)
    names = [queue_name(prefix, kind) for kind in KINDS]
    return tuple(Queue(name, exchange, routing_key=name, durable=True) for name in names)


def unknown_queues(prefix: str, asked: str | Iterable[str] | None) -> str | None:
    """Why a worker asked (``-Q``) for ``asked`` queues would wait for turns that never come
    (a name no turn is sent to: a typo, another SOULFLEET_QUEUE_PREFIX), or None."""
    names = asked.split(",") if isinstance(asked, str) else list(asked or ())
    known = [queue_name(prefix, kind) for kind in KINDS]
    unknown = [str(name).strip() for name in names if str(name).strip() not in known]
    if not unknown:
        return None
    return (
        f"-Q names queue(s) no soulfleet turn is sent to: {', '.join(map(repr, unknown))}; the "
        f"fleet's queues are {', '.join(known)} (SOULFLEET_QUEUE_PREFIX {prefix!r})"
    )

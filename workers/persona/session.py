"""A session: one lane's ongoing conversation, with the soul frozen at its start (issue 11).

The seeds say "composition happens once, at session start: a frozen snapshot" and "memory
written during a session shows up in the next session". A :class:`SessionState` is that
snapshot plus the committed history: every turn of the session sends ``soul`` byte for byte
and replays ``messages``, so the prompt a provider sees only ever grows at its end (what prompt
caches key on), until compaction (:mod:`workers.persona.compaction`) or a new session.

When a session ends is :class:`SessionConfig` (persona.toml ``[session]``): after
``idle_reset`` without a committed turn, at the first turn after ``daily_reset`` local time,
or when the host resets it (an epoch counter the pointer carries: a reset bumps it, and a state
composed under an older epoch is over). ``idle_reset = 0`` makes every turn its own session.

This module is values only: where states are stored is :mod:`workers.persona.session_files`
(files in the persona's home) and which one is current is a pointer, kept in a file by the
library and in the lane's Redis hash by the fleet, so a crashed or fenced-out turn can never
make its state current. How a turn uses all that is :mod:`workers.persona.session_plan`.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, time, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from workers.persona.messages import Message

__all__ = [
    "COMPACTION_FAILED",
    "DEFAULT_IDLE_RESET",
    "DEFAULT_MAX_TOKENS",
    "Dialect",
    "Pointer",
    "SessionConfig",
    "SessionState",
    "estimate_tokens",
    "message_chars",
    "new_session_id",
    "next_session_id",
]

DEFAULT_IDLE_RESET = 4 * 3600.0
DEFAULT_MAX_TOKENS = 60_000
_FORMAT = 1

#: How a provider frames tool results: ``openai`` sends them as ``tool`` messages, ``anthropic``
#: as ``tool_result`` blocks inside a user message (which then is no place to cut a transcript).
Dialect = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class SessionConfig:
    """persona.toml ``[session]``; the defaults are what an absent table means."""

    idle_reset: float = DEFAULT_IDLE_RESET
    daily_reset: time | None = None
    timezone: str = "UTC"
    max_tokens: int = DEFAULT_MAX_TOKENS
    keep_tail: int | None = None
    flush_to_memory: bool = False

    @property
    def tail_tokens(self) -> int:
        """Tokens of recent tail compaction keeps verbatim (default: half of max_tokens)."""
        return self.keep_tail if self.keep_tail is not None else self.max_tokens // 2

    def last_daily_reset(self, now: float) -> float | None:
        """The latest ``daily_reset`` instant at or before ``now`` (epoch seconds), if any."""
        if self.daily_reset is None:
            return None
        zone = ZoneInfo(self.timezone)
        local = datetime.fromtimestamp(now, zone)
        at = datetime.combine(local.date(), self.daily_reset, tzinfo=zone)
        if at.timestamp() > now:
            at = datetime.combine(local.date() - timedelta(days=1), self.daily_reset, tzinfo=zone)
        return at.timestamp()

    def expired(self, state: SessionState, now: float) -> str | None:
        """Why ``state`` is over at ``now`` ("idle", "daily"), or None while it goes on."""
        if self.idle_reset <= 0 or now - state.last_turn_at >= self.idle_reset:
            return "idle"
        daily = self.last_daily_reset(now)
        if daily is not None and state.last_turn_at < daily:
            return "daily"
        return None


@dataclass(frozen=True)
class Pointer:
    """Which state file is current for a lane (``state``, None: no session yet) and the reset
    ``epoch``: a state composed under another epoch was reset and is over."""

    state: str | None = None
    epoch: int = 0


def message_chars(message: Message) -> int:
    """The characters of a message that reach a model: its text and its tool calls."""
    size = len(message.content)
    for call in message.tool_calls:
        arguments = call.raw_arguments
        if arguments is None:
            arguments = json.dumps(dict(call.arguments), ensure_ascii=False)
        size += len(call.id) + len(call.name) + len(arguments)
    if message.tool_call_id is not None:
        size += len(message.tool_call_id)
    return size


def estimate_tokens(messages: Sequence[Message], system: str = "") -> int:
    """SPEC §7F's estimator: ``ceil(chars / 4)`` per message, summed (the system prompt counts
    as one message). An estimate, not a tokenizer: it only has to rank sizes sensibly."""
    total = math.ceil(len(system) / 4)
    return total + sum(math.ceil(message_chars(m) / 4) for m in messages)


def new_session_id() -> str:
    return uuid.uuid4().hex


def next_session_id(previous: str) -> str:
    """The id the session after ``previous`` gets: derived, not random, so silent beats that
    run after a session ended all land in one transcript (the next session's) instead of
    opening a new one each, and the session that finally starts continues that transcript."""
    return hashlib.sha256(f"{previous}:next".encode()).hexdigest()[:32]


#: The key of a state's ``extra`` that keeps a failing compaction (``at``: since when,
#: ``error``: the latest why) while the session stays over its budget.
COMPACTION_FAILED = "compaction_failed"


@dataclass(frozen=True)
class SessionState:
    """One committed session: frozen soul, committed history, and counters."""

    id: str
    lane: str
    epoch: int
    started_at: float
    last_turn_at: float
    soul: str
    sections: tuple[str, ...] = ()
    messages: tuple[Message, ...] = ()
    turns: int = 0
    compactions: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def estimated_tokens(self) -> int:
        return estimate_tokens(self.messages, self.soul)

    def appended(
        self, messages: Sequence[Message], *, now: float, history: Sequence[Message] | None = None
    ) -> SessionState:
        """This session after one more committed turn (``history`` replaces the old messages
        when the turn compacted them)."""
        base = self.messages if history is None else tuple(history)
        return replace(self, messages=(*base, *messages), turns=self.turns + 1, last_turn_at=now)

    def summary(self) -> dict[str, Any]:
        """What people and ``Fleet.session`` are shown (never the soul or the messages)."""
        return {
            "id": self.id,
            "lane": self.lane,
            "started_at": self.started_at,
            "last_turn_at": self.last_turn_at,
            "turns": self.turns,
            "messages": len(self.messages),
            "estimated_tokens": self.estimated_tokens(),
            "compactions": self.compactions,
            "soul_bytes": len(self.soul.encode("utf-8")),
            "sections": list(self.sections),
            "compaction_failed": self.extra.get(COMPACTION_FAILED),
        }

    def to_json(self) -> bytes:
        data = {
            "session": _FORMAT,
            "id": self.id,
            "lane": self.lane,
            "epoch": self.epoch,
            "started_at": self.started_at,
            "last_turn_at": self.last_turn_at,
            "turns": self.turns,
            "compactions": self.compactions,
            "sections": list(self.sections),
            "soul": self.soul,
            "messages": [m.to_dict() for m in self.messages],
            **({"extra": dict(self.extra)} if self.extra else {}),
        }
        return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SessionState:
        """Parse a state file; ValueError (saying what is wrong) for anything malformed."""
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ValueError(f"not a JSON session state: {exc}") from exc
        if not isinstance(data, dict) or data.get("session") != _FORMAT:
            raise ValueError(f"not a session state of format {_FORMAT}")
        try:
            return cls(
                id=str(data["id"]),
                lane=str(data["lane"]),
                epoch=int(data["epoch"]),
                started_at=float(data["started_at"]),
                last_turn_at=float(data["last_turn_at"]),
                soul=str(data["soul"]),
                sections=tuple(str(s) for s in data.get("sections", ())),
                messages=tuple(Message.from_dict(m) for m in data["messages"]),
                turns=int(data["turns"]),
                compactions=int(data.get("compactions", 0)),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed session state: {type(exc).__name__}: {exc}") from exc

"""The fleet's exceptions, drawn here first so callers know what to catch.

::

    SoulfleetError                     (workers.persona.errors)
    └── FleetError                     anything the fleet runtime refuses or cannot do
        ├── InboxFull                  a lane's inbox holds SOULFLEET_INBOX_MAX items; nothing
        │                              was written, the sender still has its item
        ├── ItemTooLarge               one inbox item is over SOULFLEET_ITEM_MAX_BYTES
        ├── UnknownPersona             no persona directory of that name under the root
        ├── LaneDeadLettered           the lane stopped after SOULFLEET_MAX_ATTEMPTS failures
        ├── RedisUnavailable           Redis did not answer (URL shown with its password hidden)
        ├── GateTimeout                no model-call slot within the wait; also a ModelError, so
        │                              the turn loop records it as a failed (retryable) call
        └── LeaseLost                  the turn's fence is no longer current; also a TurnAborted,
                                       so the turn loop stops before its next write

Every message says what happened and what to do next; none contains a password.
"""

from __future__ import annotations

from pathlib import Path

from workers.persona.errors import ModelError, SoulfleetError, TurnAborted
from workers.settings import redact_url

__all__ = [
    "FleetError",
    "GateTimeout",
    "InboxFull",
    "ItemTooLarge",
    "LaneDeadLettered",
    "LeaseLost",
    "RedisUnavailable",
    "UnknownPersona",
]


class FleetError(SoulfleetError):
    """Base of every error the fleet runtime raises."""


class InboxFull(FleetError):
    """The lane's inbox is at its bound; the post was refused and nothing was written."""

    def __init__(self, lane: str, limit: int) -> None:
        super().__init__(
            f"inbox of lane {lane!r} is full ({limit} items waiting): the item was NOT "
            "accepted and nothing was dropped; retry after the persona's next turn drains it "
            "(or raise SOULFLEET_INBOX_MAX)"
        )
        self.lane = lane
        self.limit = limit


class ItemTooLarge(FleetError):
    """One inbox item is larger than the configured byte limit; nothing was written."""

    def __init__(self, lane: str, size: int, limit: int) -> None:
        super().__init__(
            f"inbox item for lane {lane!r} is {size} bytes, over the {limit}-byte limit "
            "(SOULFLEET_ITEM_MAX_BYTES): it was NOT accepted; send a smaller item"
        )
        self.lane = lane
        self.size = size
        self.limit = limit


class UnknownPersona(FleetError):
    """No persona directory of that name exists under the personas root."""

    def __init__(self, name: str, root: Path | str) -> None:
        super().__init__(
            f"unknown persona {name!r}: no directory {name!r} under {root} "
            "(SOULFLEET_PERSONAS); each persona is one subdirectory there"
        )
        self.name = name
        self.root = root


class LaneDeadLettered(FleetError):
    """The lane was dead-lettered after too many failed or crashed turns in a row."""

    def __init__(self, lane: str, last_error: str) -> None:
        super().__init__(
            f"lane {lane!r} is dead-lettered (last error: {last_error}); fix the cause, then "
            f"`soulfleet revive {lane}` (its kept items run first)"
        )
        self.lane = lane
        self.last_error = last_error


class RedisUnavailable(FleetError):
    """Redis did not answer. The URL in the message never shows a password."""

    def __init__(self, url: str, detail: str = "") -> None:
        safe = redact_url(url)
        reason = f" ({detail})" if detail else ""
        super().__init__(
            f"Redis at {safe} is unavailable{reason}; start one with `soulfleet up` "
            "or point REDIS_URL at a running Redis"
        )
        self.url = safe
        self.detail = detail


class GateTimeout(FleetError, ModelError):
    """No fleet-wide model-call slot became free within the wait."""

    retryable = True

    def __init__(self, limit: int, waited: float) -> None:
        super().__init__(
            f"no model-call slot free after {waited:.1f}s: all "
            f"{limit} (SOULFLEET_MAX_CONCURRENT_MODEL_CALLS) are in use across the fleet"
        )
        self.limit = limit
        self.waited = waited


class LeaseLost(FleetError, TurnAborted):
    """The turn's lease fence is no longer current: another worker may own the lane now."""

    def __init__(self, lane: str, fence: int, detail: str = "") -> None:
        reason = f": {detail}" if detail else ""
        super().__init__(
            f"lease on lane {lane!r} with fence {fence} is lost{reason}; the turn stopped "
            "before its next write and changed nothing more"
        )
        self.lane = lane
        self.fence = fence
        self.detail = detail

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
        │   └── RedisFull              it answered, refusing a write: it is at its maxmemory
        ├── EvictingRedis              Redis's maxmemory-policy may evict keys: refused at start
        ├── GateTimeout                no model-call slot within the wait; also a ModelError, so
        │                              the turn loop records it as a failed (retryable) call
        ├── ProviderPaused             the provider's breaker is open: no call was made; also a
        │                              ModelError, and the turn is deferred, spending no attempt
        └── LeaseLost                  the turn's fence is no longer current; also a TurnAborted,
                                       so the turn loop stops before its next write

Every message says what happened and what to do next; none contains a password.

Failure kinds (:func:`classify`): each class carries ``retryable`` (True transient, False
permanent) as the persona core's errors do; Redis's own connection and timeout errors, and its
``BUSY``/``LOADING``/``READONLY``/``OOM``/``TRYAGAIN``/``MASTERDOWN``/``UNBLOCKED`` replies
(by redis-py's class where it has one: it strips the word), are transient too.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from pathlib import Path

import redis

from workers.persona.errors import (
    FailureKind,
    ModelError,
    SoulfleetError,
    TurnAborted,
    causes,
    failure_kind,
)
from workers.persona.transcript_layout import name_slug
from workers.settings import redact_url

__all__ = [
    "BudgetStopped",
    "EvictingRedis",
    "FleetError",
    "GateTimeout",
    "InboxFull",
    "ItemTooLarge",
    "LaneDeadLettered",
    "LeaseLost",
    "ProviderPaused",
    "RedisFull",
    "RedisUnavailable",
    "UnknownPersona",
    "UnusablePersonaName",
    "as_redis_refusal",
    "classify",
    "is_auth_refusal",
    "is_redis_blip",
    "is_redis_full",
    "redis_refusal",
]

#: Error replies of a Redis that is only busy, starting, failing over or full for a moment
#: (UNBLOCKED: a blocking command cut off as the server was demoted to a replica).
_REDIS_BLIPS = ("BUSY ", "LOADING", "READONLY", "OOM", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN",
                "UNBLOCKED")  # fmt: skip
#: redis-py's classes for some of those replies: it takes the word off their message, so the
#: text alone never matched them (a full Redis was an "unknown" failure, spending attempts).
_REDIS_BLIP_CLASSES: tuple[type[redis.RedisError], ...] = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,  # MasterDownError too
)


#: Redis 6 wraps a command refused inside a script (a full Redis refusing finish.lua's first
#: write) in a script error: "Error running script (call to f_<sha>): @user_script:26:
#: @user_script: 26: -OOM command not allowed ..." (Redis 7 replies with the refusal itself).
_SCRIPT_BLIP = re.compile(
    r"@user_script: ?\d+: -(?:" + "|".join(re.escape(word) for word in _REDIS_BLIPS) + ")"
)


#: What Redis (and redis-py) say when a client's password or user is wrong or missing.
_AUTH_FAILED = re.compile(
    r"Authentication required|NOAUTH|WRONGPASS|invalid username-password|invalid password|"
    r"AUTH <password> called without any password configured|"
    r"HELLO must be called with the client already authenticated",
    re.IGNORECASE,
)


def is_auth_refusal(detail: str) -> bool:
    """Whether a Redis error's text says it refused the client's password or user."""
    return _AUTH_FAILED.search(detail) is not None


def is_redis_blip(exc: BaseException) -> bool:
    """Whether ``exc`` is a Redis that is unreachable, or only busy, starting, failing over or
    full for a moment: a wait fixes it."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, *_REDIS_BLIP_CLASSES)):
        return True
    if not isinstance(exc, redis.ResponseError):
        return False
    text = str(exc)
    return text.startswith(_REDIS_BLIPS) or _SCRIPT_BLIP.search(text) is not None


def classify(exc: BaseException) -> FailureKind:
    """``transient``, ``permanent`` or ``unknown`` for any turn failure (see the module doc)."""
    if any(is_redis_blip(current) for current in causes(exc)):
        return "transient"
    return failure_kind(exc)


class FleetError(SoulfleetError):
    """Base of every error the fleet runtime raises."""


class InboxFull(FleetError):
    """The lane's inbox is at its bound; the post was refused and nothing was written.

    ``drain_turn``: the turn the refused post queued to drain an idle lane's inbox (the caller
    publishes it); ``state``: the lane's state when the post was refused."""

    retryable = True

    def __init__(
        self, lane: str, limit: int, *, drain_turn: str | None = None, state: str = ""
    ) -> None:
        if drain_turn is not None:
            when = "a turn to drain it was queued just now: retry once it has run"
        elif state == "idle":
            when = (
                "no turn is queued to drain it (posted without a wake): wake the persona "
                f"(`soulfleet post {lane} TEXT` wakes it, or `soulfleet run`), then retry"
            )
        elif state == "dead":
            when = f"the lane is dead-lettered: `soulfleet revive {lane}` runs its items"
        else:
            when = "retry after the persona's next turn drains it"
        super().__init__(
            f"inbox of lane {lane!r} is full ({limit} items waiting): the item was NOT "
            f"accepted and nothing was dropped; {when} (or raise SOULFLEET_INBOX_MAX where "
            "the fleet runs: beat records the fleet's, and a `soulfleet` command keeps to "
            "that, whatever its own shell says)"
        )
        self.lane = lane
        self.limit = limit
        self.drain_turn = drain_turn
        self.state = state


class ItemTooLarge(FleetError):
    """One inbox item is larger than the configured byte limit; nothing was written."""

    retryable = False

    def __init__(
        self, lane: str, size: int, limit: int, text: tuple[int, int] | None = None
    ) -> None:
        # The limit is on the item as stored, envelope included: a text just under it was
        # refused as a larger number the user never wrote. ``text``: (its bytes, the most
        # that would fit, escapes counted: InboxItem.text_room).
        advice = "; send a smaller item" if text is None else (
            f" (its text {text[0]} bytes, the rest its sender, channel, id and time, and JSON "
            f"escapes); send a text of at most about {text[1]} bytes"
        )  # fmt: skip
        super().__init__(
            f"inbox item for lane {lane!r} is {size} bytes as stored, over the {limit}-byte "
            f"limit (SOULFLEET_ITEM_MAX_BYTES, the fleet's): it was NOT accepted{advice}"
        )
        self.lane = lane
        self.size = size
        self.limit = limit


def _near_miss(name: str, known: Sequence[str]) -> str:
    """`` (did you mean 'nora'?)`` for the one of ``known`` named much like ``name``."""
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownPersona(FleetError):
    """No persona directory of that name exists under the personas root."""

    retryable = False

    def __init__(
        self,
        name: str,
        root: Path | str,
        *,
        outside: bool = False,
        known: Sequence[str] = (),
    ) -> None:
        """``outside``: ``name`` is a directory that exists, but not under ``root``.
        ``known``: the personas there, for the one spelled much like ``name`` (a typo) to be
        suggested (an error a person reads: the caller lists them)."""
        shown = os.path.abspath(os.path.expanduser(root))  # "personas" alone reads oddly
        root_is = f"the personas root {shown} (SOULFLEET_PERSONAS or --personas)"
        if outside:
            problem = (
                f"{name!r} is a directory outside {root_is}, and fleet commands only reach "
                "personas under the fleet's root: start a fleet on its parent (`soulfleet up "
                "--personas DIR`), or use `soulfleet run --local` for a directory anywhere"
            )
        elif os.sep in name or name.startswith(("~", ".")):
            problem = (
                f"no directory {name!r}; a persona is a subdirectory of {root_is}, named "
                "or given by its path"
            )
        elif name.endswith("-dreamer") and name.removesuffix("-dreamer") in known:
            # A lane `status` shows in its DREAMER column: name what reaches it.
            persona = name.removesuffix("-dreamer")
            problem = (
                f"{name!r} is the dreamer lane of the persona {persona!r}, not a persona: "
                f"`soulfleet status {persona}` shows it (DREAMER), `soulfleet revive {persona} "
                f"--dreamer` takes it back, `soulfleet dream {persona}` runs a pass"
            )
        else:
            problem = (
                f"no directory {name!r} under {root_is}; each persona is one subdirectory there"
                + _near_miss(name, known)
            )
        super().__init__(f"unknown persona {name!r}: {problem}")
        self.name = name
        self.root = root


class BudgetStopped(FleetError):
    """The persona's daily budget is used up and says ``on_exceed = "stop"``: a post is
    refused at the door, so the sender keeps it (a turn would refuse it without a reply)."""

    retryable = False

    def __init__(self, persona: str, spent: int, limit: int, resets: str) -> None:
        super().__init__(
            f"persona {persona!r} has used its daily token budget ({spent} of {limit} tokens "
            f"today, on_exceed=stop): the item was NOT accepted and nothing was queued; the "
            f"budget resets at {resets} (raise budget.daily_tokens in its persona.toml to "
            "continue now)"
        )
        self.persona = persona


class UnusablePersonaName(UnknownPersona):
    """A directory under the personas root whose name cannot be a persona (lane) name."""

    def __init__(self, name: str, root: Path | str) -> None:
        rules = (
            f"{name!r} is not a usable persona name (letters, digits, '.', '_' and '-', "
            "starting with a letter or digit; at most 64; no '..'; not ending in -dreamer)"
        )
        if name.strip(".") == "":  # "", "." or "..": a path step, not a directory to rename
            message = f"{rules}: name a persona directory under {root}"
        else:
            message = (
                f"{rules}, so the fleet skips the directory {os.path.join(str(root), name)}: "
                f"rename it, for example to {_slug(name)!r}"
            )
        FleetError.__init__(self, message)
        self.name = name
        self.root = root


def _slug(name: str) -> str:
    """A usable persona name close to ``name`` (a suggestion for a rename)."""
    slug = name_slug(name, 64)
    if slug.endswith("-dreamer"):
        # Not the bare stem: "nora-dreamer" sits beside "nora" more often than not.
        slug = slug[: -len("-dreamer")] + "_dreamer"
    return slug or "persona"


class LaneDeadLettered(FleetError):
    """The lane was dead-lettered after too many failed or crashed turns in a row."""

    def __init__(self, lane: str, last_error: str, *, kept: bool = False) -> None:
        yours = (
            "; your message is kept (do not send it again): it runs after the revive, unless "
            "the dead turn held it and `--drop-kept` drops it with that turn's items"
            if kept
            else ""
        )
        super().__init__(
            f"lane {lane!r} is dead-lettered (last error: {last_error}); fix the cause, then "
            f"`soulfleet revive {lane}` (its kept items run first; `--drop-kept` drops the "
            "ones its dead turn held, when they are what failed: a message the provider "
            f"refuses, HTTP 400){yours}"
        )
        self.lane = lane
        self.last_error = last_error


class RedisUnavailable(FleetError):
    """Redis did not answer. The URL in the message never shows a password."""

    retryable = True

    def __init__(self, url: str, detail: str = "") -> None:
        safe = redact_url(url)
        reason = f" ({detail})" if detail else ""
        if is_auth_refusal(detail):
            # It answered: running and reachable, so "check that it runs" sent people astray.
            todo = (
                "it refused this client's credentials: check the password (and user) in "
                "REDIS_URL (CELERY_BROKER_URL, when the broker is a Redis of its own) against "
                "the server's requirepass or ACL"
            )
        else:
            todo = (
                "check that it runs and that REDIS_URL points at it (CELERY_BROKER_URL, when "
                "the broker is a Redis of its own; on one machine, `soulfleet up` starts a "
                "fleet with its own Redis)"
            )
        super().__init__(f"Redis at {safe} is unavailable{reason}: {todo}")
        self.url = safe
        self.detail = detail


class RedisFull(RedisUnavailable):
    """Redis answered, but refused a write: it is at its maxmemory (noeviction). A kind of
    :class:`RedisUnavailable` (every caller that waits out an unreachable Redis waits this out
    too) whose message says what is wrong and what to do."""

    def __init__(self, url: str, detail: str = "") -> None:
        safe = redact_url(url)
        reason = f" ({detail.rstrip('.')})" if detail else ""
        FleetError.__init__(
            self,
            f"Redis at {safe} is full (used memory over its maxmemory) and refuses "
            f"writes{reason}: give it room (`redis-cli CONFIG SET maxmemory <more>`), then "
            'find what grew (ops/runbook.md "Redis memory near its limit")',
        )
        self.url = safe
        self.detail = detail


def is_redis_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal by a Redis at its maxmemory: redis-py's OutOfMemoryError, a
    pipeline's error quoting it, or an error raised while handling one (kombu re-raises Redis
    errors as its own)."""
    return any(
        isinstance(current, redis.exceptions.OutOfMemoryError)
        or (isinstance(current, redis.ResponseError) and "maxmemory" in str(current))
        for current in causes(exc, context=True)
    )


def as_redis_refusal(exc: BaseException, url: str) -> RedisUnavailable | None:
    """``exc`` as the RedisUnavailable (or RedisFull) it means, or None when it is not a Redis
    that is unreachable or full (a bug, a bad reply: its traceback matters)."""
    if isinstance(exc, RedisUnavailable):
        return exc
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return RedisUnavailable(url, str(exc) or type(exc).__name__)
    if is_redis_full(exc):
        return RedisFull(url, str(exc))
    if is_redis_blip(exc):  # read-only or failing over: beat logged a traceback each second
        return RedisUnavailable(url, f"{type(exc).__name__}: {exc}")
    return None


def redis_refusal(url: str, exc: BaseException) -> RedisUnavailable:
    """The error for a broker or Redis command that failed with ``exc``: :class:`RedisFull`
    when Redis refused it for memory, else :class:`RedisUnavailable`."""
    refusal = as_redis_refusal(exc, url)
    return refusal or RedisUnavailable(url, f"{type(exc).__name__}: {exc}".removesuffix(": "))


class EvictingRedis(FleetError):
    """Redis runs a maxmemory-policy that may evict keys; soulfleet refuses to run on it."""

    def __init__(self, url: str, policy: str) -> None:
        super().__init__(
            f"Redis at {redact_url(url)} has maxmemory-policy {policy}: under memory pressure it "
            "would silently evict inbox items, lane hashes, fences and leases (lost or doubled "
            "turns). Set maxmemory-policy noeviction (redis.conf, or CONFIG SET "
            "maxmemory-policy noeviction), or set SOULFLEET_ALLOW_EVICTION=1 to run anyway"
        )
        self.url = redact_url(url)
        self.policy = policy


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


class ProviderPaused(FleetError, ModelError):
    """The provider's breaker is open: the call was not made (nothing was spent)."""

    retryable = True

    def __init__(self, provider: str, detail: str = "") -> None:
        reason = f" ({detail})" if detail else ""
        super().__init__(
            f"provider {provider!r} is paused: most recent calls to it failed, so its breaker is "
            f"open{reason}; the turn waits and resumes by itself once a probe call succeeds "
            "(`soulfleet status` shows the breaker)"
        )
        self.provider = provider
        self.detail = detail


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

"""Token accounting: every paid model call counted once, per persona per day per model.

Why each call is written as it returns, not when its turn commits: a call is paid when the
provider answers, whatever happens to the turn afterwards. A turn that fails and is retried, or
whose worker is SIGKILLed before it commits, has still been billed for the calls it made;
counting at commit would lose exactly those (and count them again when the retry commits its
own). So :class:`MeteredModel` hands each answered call to :meth:`UsageLedger.record`, one
Lua step (:file:`lua/usage.lua`) that adds the provider-reported tokens to the persona's day
hash and the day's top-K zset together, guarded by a per-call marker so a retried write counts
once. The call id is ``<lane>:<turn id>:<fence>:<n>``: unique per attempt, stable per call.

A persona's day is the day in its budget's time zone (UTC unless ``budget.timezone`` says
otherwise), so the numbers a budget is checked against are the numbers ``soulfleet usage``
shows. Day keys expire after ``SOULFLEET_USAGE_DAYS``.

Metrics carry provider, model and turn kind, never a persona (the series must not grow with the
fleet); per-persona numbers live here, in Redis, for ``soulfleet usage`` and ``status``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import redis

from workers import metrics
from workers.fleet.keys import Keys
from workers.fleet.scripts import ScriptCall, Scripts, redis_errors, run_scripts
from workers.persona.clock import Clock, SystemClock
from workers.persona.messages import Completion, Message, ToolSpec, Usage
from workers.persona.models import Model
from workers.persona.spend import usage_day

__all__ = [
    "CALL_MARKER_TTL",
    "DayUsage",
    "MeteredModel",
    "ModelUsage",
    "UsageLedger",
    "model_label",
]

#: How long a counted call's marker lives: far longer than any client retry of its write.
CALL_MARKER_TTL = 600.0
_TOTALS = ("input", "output", "cached", "cache_write", "calls")


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """One model's share of a persona's day."""

    input: int = 0
    output: int = 0
    cached: int = 0
    calls: int = 0

    @property
    def tokens(self) -> int:
        return self.input + self.output

    def to_dict(self) -> dict[str, int]:
        return {
            "tokens": self.tokens,
            "input": self.input,
            "output": self.output,
            "cached": self.cached,
            "calls": self.calls,
        }


@dataclass(frozen=True, slots=True)
class DayUsage:
    """One persona's model use on one day."""

    persona: str
    day: str
    input: int = 0
    output: int = 0
    cached: int = 0
    cache_write: int = 0
    calls: int = 0
    models: dict[str, ModelUsage] = field(default_factory=dict)
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.input + self.output

    def to_dict(self) -> dict[str, Any]:
        return {
            "persona": self.persona,
            "day": self.day,
            "tokens": self.tokens,
            "input": self.input,
            "output": self.output,
            "cached": self.cached,
            "cache_write": self.cache_write,
            "calls": self.calls,
            "models": {name: m.to_dict() for name, m in sorted(self.models.items())},
            "kinds": {kind: dict(values) for kind, values in sorted(self.kinds.items())},
        }

    @classmethod
    def from_hash(cls, persona: str, day: str, fields: dict[str, str]) -> DayUsage:
        totals = {name: int(fields.get(name) or 0) for name in _TOTALS}
        per_model: dict[str, dict[str, int]] = {}
        kinds: dict[str, dict[str, int]] = {}
        for key, value in fields.items():
            name, bar, model = key.partition("|")
            if bar and name in ("input", "output", "cached", "calls"):
                per_model.setdefault(model, {})[name] = int(value)
                continue
            name, at, kind = key.partition("@")
            if at and name in ("calls", "tokens"):
                kinds.setdefault(kind, {})[name] = int(value)
        models = {model: ModelUsage(**values) for model, values in per_model.items()}
        return cls(persona, day, models=models, kinds=kinds, **totals)


class UsageLedger:
    """Per-persona, per-day token usage in Redis. Thread-safe; share one per process."""

    def __init__(
        self, client: redis.Redis, keys: Keys, *, days: int, clock: Clock | None = None
    ) -> None:
        if days < 1:
            raise ValueError(f"days must be >= 1, got {days}")
        self.client = client
        self.keys = keys
        self.days = days
        self.clock: Clock = clock or SystemClock()
        self.scripts = Scripts.register(client)

    def today(self, timezone: str = "UTC") -> str:
        return usage_day(self.clock.time(), timezone)

    def record(
        self,
        *,
        persona: str,
        day: str,
        call_id: str,
        model: str,
        kind: str,
        usage: Usage,
    ) -> int:
        """Count one answered call; return the persona's tokens that day (-1: already counted)."""
        call = self.record_call(
            persona=persona, day=day, call_id=call_id, model=model, kind=kind, usage=usage
        )
        return int(run_scripts(self.client, [call])[0])

    def record_call(
        self,
        *,
        persona: str,
        day: str,
        call_id: str,
        model: str,
        kind: str,
        usage: Usage,
    ) -> ScriptCall:
        """:meth:`record` prepared, not sent (to share a round trip; the reply is the same)."""
        keep_ms = int((self.days + 1) * 86400 * 1000)
        keys = [
            self.keys.usage(day, persona),
            self.keys.usage_top(day),
            self.keys.usage_call(call_id),
        ]
        args: list[str | int] = [
            persona, model, kind, usage.input_tokens, usage.output_tokens,
            usage.cached_input_tokens, usage.cache_write_input_tokens,
            keep_ms, int(CALL_MARKER_TTL * 1000),
        ]  # fmt: skip
        return ScriptCall(self.scripts.usage, keys, args)

    def spent(self, persona: str, day: str) -> int:
        """The persona's tokens (input + output) on ``day``."""
        return self.spent_many([(persona, day)])[0]

    def spent_many(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """:meth:`spent` for many ``(persona, day)`` pairs in one round trip."""
        if not pairs:
            return []
        with redis_errors(self.client):
            pipe = self.client.pipeline(transaction=False)
            for persona, day in pairs:
                pipe.hget(self.keys.usage(day, persona), "tokens")
            return [int(value or 0) for value in pipe.execute()]

    def days_back(self, days: int, timezone: str = "UTC") -> list[str]:
        """The last ``days`` day names, newest first (today included): calendar days, so a
        day of 23 or 25 hours (a DST change) is neither skipped nor named twice."""
        today = date.fromisoformat(usage_day(self.clock.time(), timezone))
        return [(today - timedelta(days=n)).isoformat() for n in range(days)]

    def usage(self, personas: Iterable[str] | None, days: Sequence[str]) -> list[DayUsage]:
        """Each named persona's use on each of ``days`` (None: every persona that used any),
        newest day first, then most tokens first."""
        with redis_errors(self.client):
            pairs: list[tuple[str, str]] = []
            if personas is None:
                pipe = self.client.pipeline(transaction=False)
                for day in days:
                    pipe.zrevrange(self.keys.usage_top(day), 0, -1)
                for day, names in zip(days, pipe.execute(), strict=True):
                    pairs += [(name, day) for name in names]
            else:
                wanted = list(personas)
                pairs = [(name, day) for day in days for name in wanted]
            pipe = self.client.pipeline(transaction=False)
            for persona, day in pairs:
                pipe.hgetall(self.keys.usage(day, persona))
            found = pipe.execute()
        rows = [
            DayUsage.from_hash(persona, day, fields)
            for (persona, day), fields in zip(pairs, found, strict=True)
        ]
        order = {day: index for index, day in enumerate(days)}
        return sorted(rows, key=lambda row: (order[row.day], -row.tokens, row.persona))

    def top(self, day: str, count: int) -> list[tuple[str, int]]:
        """The ``count`` biggest spenders on ``day``: ``(persona, tokens)``, most first."""
        with redis_errors(self.client):
            rows: list[tuple[str, float]] = self.client.zrevrange(
                self.keys.usage_top(day), 0, count - 1, withscores=True
            )  # type: ignore[assignment]
        return [(str(name), int(score)) for name, score in rows]


def model_label(spec: str, provider: str) -> str:
    """The ``model`` metric label: the model name for a provider's model; just the provider for
    a scripted one, whose spec holds a per-persona file path (a series per persona)."""
    if provider in ("openai", "anthropic"):
        return spec.partition(":")[2] or spec
    return provider


class MeteredModel:
    """A :class:`Model` whose every answered call is counted in a :class:`UsageLedger` and
    in ``soulfleet_model_tokens_total`` / ``soulfleet_model_calls_total``.

    A call that raises was not answered and costs nothing here (providers do not bill a
    failed request). ``call_prefix`` must be unique per turn attempt (``lane:turn:fence``).
    """

    def __init__(
        self,
        model: Model,
        ledger: UsageLedger,
        *,
        persona: str,
        day: str,
        call_prefix: str,
        kind: str,
        provider: str,
    ) -> None:
        self.model = model
        self.ledger = ledger
        self.persona = persona
        self.day = day
        self.call_prefix = call_prefix
        self.kind = kind
        self.provider = provider
        self.calls = 0
        self.spent_today: int | None = None
        self._lock = threading.Lock()

    @property
    def spec(self) -> str:
        return self.model.spec

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        completion, call = self.call(system=system, messages=messages, tools=tools)
        self.settle(run_scripts(self.ledger.client, [call])[0])
        return completion

    def call(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> tuple[Completion, ScriptCall]:
        """The model's answer and the usage record it owes, not yet sent: the caller sends it
        (with its own after-call writes, in one round trip) and passes the reply to
        :meth:`settle`. A call that raises owes nothing."""
        completion = self.model.complete(system=system, messages=messages, tools=tools)
        with self._lock:
            self.calls += 1
            number = self.calls
        usage = completion.usage
        label = model_label(self.model.spec, self.provider)
        metrics.MODEL_CALLS.labels(self.provider, label, self.kind).inc()
        for kind, count in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cached_input", usage.cached_input_tokens),
        ):
            metrics.MODEL_TOKENS.labels(self.provider, label, self.kind, kind).inc(count)
        record = self.ledger.record_call(
            persona=self.persona,
            day=self.day,
            call_id=f"{self.call_prefix}:{number}",
            model=self.model.spec,
            kind=self.kind,
            usage=usage,
        )
        return completion, record

    def settle(self, reply: object) -> None:
        """The usage record's reply: the persona's tokens that day (-1: already counted)."""
        self.spent_today = int(str(reply))

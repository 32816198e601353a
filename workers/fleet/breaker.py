"""The provider breaker: when most calls to one provider fail, the fleet stops calling it.

Without it, a provider outage is paid for by every lane with work: each turn burns its model
retries against a dead endpoint, fails, backs off and tries again, and the provider, once it
comes back, meets the whole backlog at once. With it:

- every model call is counted per provider (``breaker_record.lua``: a sliding-window counter,
  two numbers per window, in one hash per provider, shared by every worker of the fleet);
- once at least ``SOULFLEET_BREAKER_MIN_CALLS`` calls in ``SOULFLEET_BREAKER_WINDOW`` failed
  ``SOULFLEET_BREAKER_FAILURE_RATIO`` of the time, the breaker OPENS: :meth:`Breaker.allow`
  says "open" and the turn is deferred before any call is made (``defer.lua``: no attempt is
  spent, the lane waits in ``deferred:<provider>``);
- while open, one call per ``SOULFLEET_BREAKER_PROBE_INTERVAL`` fleet-wide is let through as a
  probe (``breaker_allow.lua``). Beat's recovery pass hands a deferred lane to a worker for it
  when none arrives by itself; the first call that succeeds CLOSES the breaker and beat queues
  every deferred lane again: lanes resume by themselves.

Only failures that say the provider is unwell count (5xx, 429, timeouts, connection errors,
malformed replies): a 401 or 403 says the provider is up and refuses the fleet's key (keys are
per provider, so every lane of it meets the same refusal: the lanes it reaches are
dead-lettered, `status` groups them with the `revive --reason` that takes them back once the
key is fixed), and a gate timeout is our own queue. The scripted (offline) model has no
breaker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import redis
import structlog

from workers.fleet.keys import Keys
from workers.fleet.scripts import ScriptCall, Scripts, redis_errors, run_scripts
from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import (
    ModelRateLimited,
    ModelResponseError,
    ModelServerError,
    ModelTimeout,
    ModelUnreachable,
)

__all__ = ["Breaker", "BreakerState", "counts_against_provider"]

_log = structlog.get_logger("soulfleet.breaker")

Verdict = Literal["closed", "probe", "open"]

_PROVIDER_TROUBLE = (
    ModelServerError,
    ModelRateLimited,
    ModelTimeout,
    ModelUnreachable,
    ModelResponseError,
)


def counts_against_provider(exc: BaseException) -> bool:
    """Whether a failed call is evidence that the provider itself is unwell."""
    return isinstance(exc, _PROVIDER_TROUBLE)


@dataclass(frozen=True, slots=True)
class BreakerState:
    """One provider's breaker as ``soulfleet status`` and the metrics show it."""

    provider: str
    open: bool
    opened_at: float | None
    probe_at: float | None
    deferred: int
    calls_total: int
    failures_total: int
    probes: int
    last_error: str
    #: a probe call is in flight right now (another would only be refused)
    probing: bool = False


class Breaker:
    """Every provider breaker of one fleet. Thread-safe; share one per process."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        window: float,
        min_calls: int,
        failure_ratio: float,
        probe_interval: float,
        probe_ttl: float,
        clock: Clock | None = None,
    ) -> None:
        if window <= 0 or probe_interval <= 0 or probe_ttl <= 0:
            raise ValueError("window, probe_interval and probe_ttl must be > 0")
        if min_calls < 1 or not 0 < failure_ratio <= 1:
            raise ValueError("min_calls must be >= 1 and failure_ratio in (0, 1]")
        self.client = client
        self.keys = keys
        self.window = window
        self.min_calls = min_calls
        self.failure_ratio = failure_ratio
        self.probe_interval = probe_interval
        self.probe_ttl = probe_ttl
        self.clock: Clock = clock or SystemClock()
        self.scripts = Scripts.register(client)

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def allow(self, provider: str, lane: str = "") -> Verdict:
        """``closed`` (call), ``probe`` (call: you are the probe) or ``open`` (do not call).
        ``lane``: whose call it is (a probe's lane, once reaped, frees the probe slot)."""
        with redis_errors(self.client):
            verdict = str(
                self.scripts.breaker_allow(
                    keys=[self.keys.breaker(provider)],
                    args=[self._now_ms(), int(self.probe_ttl * 1000), lane],
                )
            )
        if verdict == "probe":
            _log.info("breaker.probe", provider=provider)
        return "probe" if verdict == "probe" else "open" if verdict == "open" else "closed"

    def record(self, provider: str, *, ok: bool, error: str = "", probe: bool = False) -> str:
        """Count one finished call (``probe``: it was the breaker's probe); returns what the
        breaker did (``opened``, ``closed_now``, ``open`` or ``closed``) and logs the
        transitions."""
        call = self.record_call(provider, ok=ok, error=error, probe=probe)
        reply = run_scripts(self.client, [call])[0]
        return self.recorded(provider, reply, error=error)

    def record_call(
        self, provider: str, *, ok: bool, error: str = "", probe: bool = False
    ) -> ScriptCall:
        """:meth:`record` prepared, not sent; pass its reply to :meth:`recorded`."""
        args: list[str | int] = [
            provider, self._now_ms(), "ok" if ok else "fail", int(self.window * 1000),
            self.min_calls, repr(self.failure_ratio), int(self.probe_interval * 1000),
            error[:500], "probe" if probe else "",
        ]  # fmt: skip
        keys = [self.keys.breaker(provider), self.keys.breakers]
        return ScriptCall(self.scripts.breaker_record, keys, args)

    def recorded(self, provider: str, reply: object, *, error: str = "") -> str:
        """What a recorded call did to the breaker (logging the transitions)."""
        outcome = str(reply)
        if outcome == "opened":
            _log.error(
                "breaker.opened",
                provider=provider,
                error=error[:300],
                probe_in_s=self.probe_interval,
            )
        elif outcome == "closed_now":
            _log.warning("breaker.closed", provider=provider)
        return outcome

    def record_failure(self, provider: str, exc: BaseException, *, probe: bool = False) -> None:
        """:meth:`record` a failed call if it counts against the provider, or if it was the
        probe (whatever failed it: a probe must always report, or the next one waits for the
        probe ttl)."""
        if probe or counts_against_provider(exc):
            self.record(provider, ok=False, error=f"{type(exc).__name__}: {exc}", probe=probe)

    def release_probes(self, lanes: Sequence[str]) -> list[str]:
        """Free the probe slot of each provider whose probe ran on one of ``lanes`` (reaped:
        their workers died mid-turn); the providers freed. Without this a dead probe held its
        provider's deferred lanes for the whole probe ttl (20 minutes at the defaults)."""
        if not lanes:
            return []
        with redis_errors(self.client):
            providers = sorted(str(p) for p in self.client.smembers(self.keys.breakers))
        if not providers:
            return []
        now = self._now_ms()
        calls = [
            ScriptCall(self.scripts.breaker_release, [self.keys.breaker(p)], [now, *lanes])
            for p in providers
        ]
        freed: list[str] = []
        for provider, reply in zip(providers, run_scripts(self.client, calls, isolated=True),
                                   strict=True):  # fmt: skip
            if isinstance(reply, Exception):  # one broken key: the others are still freed
                _log.warning("breaker.release_failed", provider=provider, error=str(reply))
            elif reply == 1:
                freed.append(provider)
                _log.warning("breaker.probe_released", provider=provider,
                             reason="its lane was reaped: the probe's worker died")  # fmt: skip
        return freed

    def look(self, provider: str) -> Literal["closed", "paused", "probe_due"]:
        """Read-only, one round trip: ``closed`` (``allow`` would say "closed" now, with no
        side effect), ``paused`` (open, no probe may go now: a turn can be deferred before it
        writes anything) or ``probe_due`` (open, and the next ``allow`` hands out the probe)."""
        with redis_errors(self.client):
            state, probe_at, probe_until = self.client.hmget(
                self.keys.breaker(provider), ["state", "probe_at", "probe_until"]
            )
        if state != "open":
            return "closed"
        now = self._now_ms()
        if now < float(probe_at or 0) or float(probe_until or 0) > now:
            return "paused"
        return "probe_due"

    def is_open(self, provider: str) -> bool:
        with redis_errors(self.client):
            return self.client.hget(self.keys.breaker(provider), "state") == "open"

    def states(self) -> list[BreakerState]:
        """Every provider with a breaker record, sorted by name (one round trip per 2 keys)."""
        with redis_errors(self.client):
            providers = sorted(str(p) for p in self.client.smembers(self.keys.breakers))
            pipe = self.client.pipeline(transaction=False)
            for provider in providers:
                pipe.hgetall(self.keys.breaker(provider))
                pipe.zcard(self.keys.deferred(provider))
            replies = pipe.execute()
        states: list[BreakerState] = []
        for index, provider in enumerate(providers):
            fields: dict[str, str] = replies[2 * index]
            deferred = int(replies[2 * index + 1])

            def when(name: str, fields: dict[str, str] = fields) -> float | None:
                value = fields.get(name)
                return int(float(value)) / 1000 if value else None

            is_open = fields.get("state") == "open"
            states.append(
                BreakerState(
                    provider=provider,
                    open=is_open,
                    opened_at=when("opened_at") if is_open else None,
                    probe_at=when("probe_at") if is_open else None,
                    deferred=deferred,
                    calls_total=int(fields.get("calls_total") or 0),
                    failures_total=int(fields.get("failures_total") or 0),
                    probes=int(fields.get("probes") or 0),
                    last_error=fields.get("last_error", "") if is_open else "",
                    probing=is_open and (when("probe_until") or 0) > self.clock.time(),
                )
            )
        return states

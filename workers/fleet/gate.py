"""The fleet-wide turn gate: at most N model calls at once across every host, and GatedModel.

Providers rate-limit per account, not per worker, so the limit has to be fleet-wide. The gate is
one Redis sorted set (``Keys.gate``): member = a holder token, score = when its slot expires.
:file:`gate_acquire.lua` first drops expired members, then adds the token only if fewer than
``limit`` remain, in one atomic step, so at most ``limit`` unexpired holders ever exist. A
holder renews its slot through the process's :class:`~workers.fleet.lease.Renewer` while its call
runs; a holder that dies stops renewing and its slot frees itself after ``slot_ttl``: a crash
can never leak a slot. ``limit == 0`` means unlimited and makes no Redis calls at all.

Only the model call is gated (:class:`GatedModel` wraps ``Model.complete`` and nothing else):
tool calls and memory writes never hold a slot, so a slow tool cannot starve the fleet.
Scores use each host's clock: keep hosts NTP-synchronised (skew eats into ``slot_ttl``).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis
import structlog

from workers import metrics
from workers.fleet.errors import GateTimeout, ProviderPaused, as_redis_refusal
from workers.fleet.keys import Keys
from workers.fleet.lease import Held, Renewer
from workers.fleet.scripts import ScriptCall, Scripts, client_url, redis_errors, run_scripts
from workers.fleet.usage import CALL_MARKER_TTL, MeteredModel
from workers.persona.call_log import CallLog, call_key
from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import ModelRequestError, TurnTimeUp
from workers.persona.messages import Completion, Message, ToolSpec
from workers.persona.models import Model
from workers.persona.turn_time import bounded_timeout

if TYPE_CHECKING:
    from workers.fleet.breaker import Breaker, Verdict

__all__ = ["Gate", "GatedModel", "InFlight", "ModelCall", "Slot", "SlotHandle", "in_flight"]

_log = structlog.get_logger("soulfleet.gate")


@dataclass(frozen=True, slots=True)
class InFlight:
    """A model call holding a gate slot: the worker (host:pid), the lane, and when it took the
    slot (epoch seconds; the call follows at once)."""

    holder: str
    lane: str
    started: float

    @classmethod
    def parse(cls, token: str) -> InFlight | None:
        parts = token.rsplit(":", 3)
        stamp = parts[2] if len(parts) == 4 else ""
        if not (stamp.isascii() and stamp.isdigit()) or len(parts[3]) != 32:
            return None
        holder, lane, started_ms, _ = parts
        return cls(holder, lane, int(started_ms) / 1000)


def in_flight(tokens: Iterable[object]) -> list[InFlight]:
    """The calls the gate's slot ``tokens`` name, oldest first (a token of another format, as
    an older worker's, is left out)."""
    calls = [call for token in tokens if (call := InFlight.parse(str(token))) is not None]
    return sorted(calls, key=lambda call: call.started)


class SlotHandle(Held):
    """A held gate slot, renewed by the :class:`Renewer` while the model call runs."""

    def __init__(self, gate: Gate, token: str) -> None:
        super().__init__(gate.slot_ttl)
        self.gate = gate
        self.token = token

    def __repr__(self) -> str:
        return f"SlotHandle(token={self.token!r})"

    @property
    def owner(self) -> object:
        return self.gate

    @classmethod
    def renew_group(cls, handles: Sequence[SlotHandle]) -> list[bool]:
        return handles[0].gate.renew_many([h.token for h in handles])

    def check(self) -> None:
        """A lost slot does not stop a call already running; there is nothing to raise."""


@dataclass(slots=True)
class Slot:
    """What :meth:`Gate.slot` yields. ``token``/``handle`` are None when the gate is unlimited."""

    token: str | None
    waited: float
    handle: SlotHandle | None
    gate: Gate | None = None
    handed_over: bool = False

    def handover(self) -> ScriptCall | None:
        """Stop renewing the slot and return its release, for the caller to send with its own
        after-call writes (one round trip); ``slot()`` then releases nothing. None: no slot."""
        if self.token is None or self.gate is None or self.handed_over:
            return None
        self.handed_over = True
        if self.handle is not None:
            self.handle.close()
        return self.gate.release_call(self.token)


class Gate:
    """A counting semaphore shared by every worker of one fleet. Thread-safe."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        limit: int,
        slot_ttl: float,
        renewer: Renewer | None = None,
        clock: Clock | None = None,
        poll_min: float = 0.005,
        poll_max: float = 0.2,
    ) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0 (0 = unlimited), got {limit}")
        if slot_ttl <= 0:
            raise ValueError(f"slot_ttl must be > 0, got {slot_ttl}")
        self.client = client
        self.keys = keys
        self.limit = limit
        self.slot_ttl = slot_ttl
        self.clock: Clock = clock or SystemClock()
        self.poll_min = poll_min
        self.poll_max = poll_max
        self.scripts = Scripts.register(client)
        self._renewer = renewer
        self._renewer_lock = threading.Lock()
        if renewer is not None:
            renewer.serve_ttl(self.slot_ttl)
        self._holder = f"{socket.gethostname()}:{os.getpid()}"

    @property
    def unlimited(self) -> bool:
        return self.limit == 0

    @property
    def renewer(self) -> Renewer:
        """The renewer slots register with (a private one if none was given)."""
        with self._renewer_lock:
            if self._renewer is None:
                self._renewer = Renewer(ttl=self.slot_ttl)
            return self._renewer

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def _ttl_ms(self) -> int:
        return max(1, int(self.slot_ttl * 1000))

    def new_token(self, lane: str = "") -> str:
        """A holder token: host and pid, the lane whose call it is and when it began (for
        operators reading the zset, and :meth:`in_flight`), plus uuid4 hex."""
        return f"{self._holder}:{lane}:{self._now_ms()}:{uuid.uuid4().hex}"

    def in_flight(self) -> list[InFlight]:
        """The model calls holding a slot now, oldest first (their tokens say whose and since
        when; a token of another format is left out)."""
        if self.unlimited:
            return []
        with redis_errors(self.client):
            return in_flight(self.client.zrangebyscore(self.keys.gate, self._now_ms(), "+inf"))

    # -- the transitions --------------------------------------------------------------------
    def acquire(self, token: str) -> bool:
        """Take a slot for ``token`` if one is free (or extend it if ``token`` holds one)."""
        args: list[str | int] = [self._now_ms(), self.limit, token, self._ttl_ms()]
        with redis_errors(self.client):
            return bool(self.scripts.gate_acquire(keys=[self.keys.gate], args=args))

    def renew(self, token: str) -> bool:
        """Extend ``token``'s slot; False if it is gone (expired and dropped)."""
        return self.renew_many([token])[0]

    def renew_many(self, tokens: Sequence[str]) -> list[bool]:
        """Extend many slots in one call (the Renewer's batch)."""
        if not tokens:
            return []
        args: list[str | int] = [self._now_ms(), self._ttl_ms(), *tokens]
        with redis_errors(self.client):
            replies = self.scripts.gate_renew(keys=[self.keys.gate], args=args)
        return [bool(ok) for ok in replies]

    def release(self, token: str) -> bool:
        """Give the slot back; False if it had already expired."""
        return bool(run_scripts(self.client, [self.release_call(token)])[0])

    def release_call(self, token: str) -> ScriptCall:
        """:meth:`release` prepared, not sent."""
        return ScriptCall(self.scripts.gate_release, [self.keys.gate], [token])

    def holders(self) -> int:
        """How many unexpired slots are held right now."""
        with redis_errors(self.client):
            return int(self.client.zcount(self.keys.gate, f"({self._now_ms()}", "+inf"))

    @contextmanager
    def slot(self, timeout: float | None = None, *, lane: str = "") -> Iterator[Slot]:
        """Hold one slot for the ``with`` body, waiting for one first.

        Polls with jittered exponential backoff (``poll_min`` .. ``poll_max``) on the gate's
        clock; raises :class:`GateTimeout` after ``timeout`` seconds (None: wait forever).
        The wait is observed in ``soulfleet_turn_gate_wait_seconds``.
        """
        if self.unlimited:
            metrics.TURN_GATE_WAIT.observe(0.0)
            yield Slot(None, 0.0, None)
            return
        began = self.clock.monotonic()
        delay = self.poll_min
        # A token per attempt (a refused one leaves nothing): its start is when the slot was
        # taken, so a call's age (in_flight) never counts a wait for a full gate.
        while not self.acquire(token := self.new_token(lane)):
            waited = self.clock.monotonic() - began
            if timeout is not None and waited >= timeout:
                metrics.TURN_GATE_WAIT.observe(waited)
                raise GateTimeout(self.limit, waited)
            pause = delay * random.uniform(0.5, 1.5)
            if timeout is not None:
                pause = min(pause, max(0.0, timeout - waited))
            self.clock.sleep(pause)
            delay = min(delay * 2, self.poll_max)
        waited = self.clock.monotonic() - began
        metrics.TURN_GATE_WAIT.observe(waited)
        handle = SlotHandle(self, token)
        try:
            self.renewer.register(handle)
        except BaseException:
            # A renewer that refuses (stopped at shutdown): hand the slot back now rather than
            # hold it, unrenewed and unused, until slot_ttl frees it.
            with contextlib.suppress(Exception):
                self.release(token)
            raise
        held = Slot(token, waited, handle, self)
        try:
            yield held
        finally:
            if not held.handed_over:
                handle.close()
                try:
                    self.release(token)
                except Exception as exc:  # the slot expires by itself after slot_ttl
                    _log.warning("gate.release_failed", error=str(exc))


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One gated model call, reported to ``GatedModel(on_call=...)``."""

    provider: str
    waited: float
    seconds: float
    error: str | None = None


#: How long an answered call's usage record is kept trying after its call gave up on Redis:
#: well inside the call marker's life (``CALL_MARKER_TTL``), which keeps a resend counted once.
OWED_USAGE_WAIT = CALL_MARKER_TTL / 2


class OwedUsage:
    """Usage records of answered calls whose Redis was down longer than the call waited: one
    daemon thread per process sends them once it answers. Thread-safe."""

    def __init__(self, wait: float = OWED_USAGE_WAIT, clock: Clock | None = None) -> None:
        self.wait = wait
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._owed: list[tuple[redis.Redis, ScriptCall, float]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def owe(self, client: redis.Redis, call: ScriptCall) -> None:
        with self._lock:
            self._owed.append((client, call, self.clock.monotonic() + self.wait))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="soulfleet-owed-usage", daemon=True
                )
                self._thread.start()
        self._wake.set()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._owed)

    def _run(self) -> None:
        pause = 0.2
        while True:
            self._wake.wait(pause)
            self._wake.clear()
            with self._lock:
                owed, self._owed = self._owed, []
            if not owed:
                with self._lock:
                    if not self._owed:
                        self._thread = None
                        return
                continue
            kept: list[tuple[redis.Redis, ScriptCall, float]] = []
            for client, call, deadline in owed:
                try:
                    run_scripts(client, [call])
                    _log.info("usage.recorded_late")
                except Exception as exc:
                    if self.clock.monotonic() < deadline and as_redis_refusal(
                        exc, client_url(client)
                    ):
                        kept.append((client, call, deadline))
                    else:
                        _log.error("usage.record_lost", error=str(exc)[:300])
            with self._lock:
                self._owed.extend(kept)
            pause = min(pause * 2, 2.0) if kept else 0.2


OWED_USAGE = OwedUsage()


class _Unsettled(Exception):
    """An answered (paid) call whose after-call writes Redis refused: carries the answer to
    :meth:`GatedModel.complete`, which keeps it for the turn's retry and raises ``cause``."""

    def __init__(self, completion: Completion, cause: Exception) -> None:
        super().__init__(str(cause))
        self.completion = completion
        self.cause = cause


class GatedModel:
    """A :class:`~workers.persona.models.Model` whose ``complete`` holds a gate slot.

    ``provider`` labels ``soulfleet_model_call_seconds`` (``provider_of(model)``); ``on_call``
    hears about every call after it ends (a recorder in tests, logs in production). A gate
    wait past ``timeout`` raises :class:`GateTimeout`, a retryable ``ModelError``.

    With a ``breaker`` (:class:`workers.fleet.breaker.Breaker`), the provider's breaker is asked
    before the gate: while it is open the call is not made and :class:`ProviderPaused` is
    raised (the turn executor defers the turn); every call made is counted by it.

    An answered call is paid for: when Redis cannot take its after-call writes (restarting,
    failing over, full for a moment), they are sent again for up to ``settle_wait`` seconds
    (the usage record counts once however often it is sent) before the call fails. Failing at
    once threw the paid answer away, and the turn's retry paid for it again. A call that fails
    so, after waiting, still keeps its answer in the turn's call log: the retry replays it.
    """

    def __init__(
        self,
        model: Model,
        gate: Gate,
        *,
        provider: str = "other",
        timeout: float | None = None,
        on_call: Callable[[ModelCall], None] | None = None,
        breaker: Breaker | None = None,
        settle_wait: float = 10.0,
        calls: CallLog | None = None,
        lane: str = "",
    ) -> None:
        self.model = model
        #: The lane whose turn makes the calls (named in its gate slot: ``Gate.in_flight``).
        self.lane = lane
        #: The answers this turn's work bought (a retry replays them instead of paying).
        self.calls = calls
        self.settle_wait = settle_wait
        self.breaker = breaker
        self.gate = gate
        self.provider = provider
        self.timeout = timeout
        self.on_call = on_call
        self._seen_closed = False

    @property
    def spec(self) -> str:
        return self.model.spec

    def seen_closed(self) -> None:
        """The caller just read the breaker closed (:meth:`Breaker.look`): the next call goes
        without asking :meth:`Breaker.allow` again, which on a closed breaker would only
        answer "closed" with no side effect (one round trip saved per turn). Later calls ask."""
        self._seen_closed = True

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        calls = self.calls
        key = ""
        if calls is not None:
            # A retried turn's call its failed attempt already bought is answered from the
            # log: no provider, no gate slot, no breaker, nothing paid (call_log.py).
            key = call_key(messages, tools)
            kept = calls.recall(key)
            if kept is not None:
                return kept
        failure: Exception | None = None
        try:
            answer = self._complete(system, messages, tools)
        except _Unsettled as unsettled:
            # Answered (paid), but Redis refused the after-call writes for longer than the
            # settle wait: the turn fails and retries, and its retry replays this answer
            # instead of paying for it again (the usage record is owed, sent once Redis is back).
            answer, failure = unsettled.completion, unsettled.cause
        except ModelRequestError:
            # The provider refused the request itself (a 400: dead-lettered at once): it may
            # be built on an answer kept here, and a revived retry replaying that answer would
            # send the very request again, for ever. It asks again instead.
            if calls is not None:
                calls.forget()
            raise
        if calls is not None:
            calls.keep(key, answer)
        if failure is not None:
            raise failure  # outside the handler: the turn sees Redis's error as it was raised
        return answer

    def _complete(
        self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        breaker = self.breaker
        if breaker is None:
            return self._call(system, messages, tools, verdict=None)
        if self._seen_closed:
            self._seen_closed = False
            verdict: Verdict = "closed"
        else:
            verdict = breaker.allow(self.provider, self.lane)
        if verdict == "open":
            raise ProviderPaused(self.provider)
        try:
            return self._call(system, messages, tools, verdict=verdict)
        except _Unsettled:
            raise  # the provider answered: nothing to hold against it
        except Exception as exc:
            # A probe reports whatever failed it (a gate timeout too): otherwise the next
            # probe would wait out the probe ttl.
            breaker.record_failure(self.provider, exc, probe=verdict == "probe")
            raise

    def _call(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        verdict: Verdict | None,
    ) -> Completion:
        clock = self.gate.clock
        # Inside a turn, no longer than the turn has left (turn_time.py).
        wait = None if self.timeout is None else bounded_timeout(self.timeout)
        held = contextlib.ExitStack()
        try:
            slot = held.enter_context(self.gate.slot(wait, lane=self.lane))
        except GateTimeout as exc:
            if wait is not None and self.timeout is not None and wait < self.timeout:
                raise TurnTimeUp(
                    f"no model-call slot came free in the {wait:.1f}s the turn had left of "
                    "SOULFLEET_TURN_MAX_SECONDS"
                ) from exc
            raise
        with held:
            began = clock.monotonic()
            error: str | None = None
            try:
                if isinstance(self.model, MeteredModel):
                    completion, owed = self.model.call(
                        system=system, messages=messages, tools=tools
                    )
                else:
                    completion = self.model.complete(system=system, messages=messages, tools=tools)
                    owed = None
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                seconds = clock.monotonic() - began
                metrics.MODEL_CALL_SECONDS.labels(provider=self.provider).observe(seconds)
                if self.on_call is not None:
                    self.on_call(ModelCall(self.provider, slot.waited, seconds, error))
            try:
                self._settle(owed, slot, ok=verdict is not None)
            except Exception as exc:
                raise _Unsettled(completion, exc) from exc
            return completion

    def _settle(self, owed: ScriptCall | None, slot: Slot, *, ok: bool) -> None:
        """What an answered call owes Redis — its usage record, the gate slot back, the
        breaker's count of a success — in ONE round trip instead of three."""
        calls: list[ScriptCall] = []
        if owed is not None:
            calls.append(owed)
        release = slot.handover()
        if release is not None:
            calls.append(release)
        breaker = self.breaker if ok else None
        if breaker is not None:
            calls.append(breaker.record_call(self.provider, ok=True))
        if not calls:
            return
        try:
            replies = self._send(calls)
        except Exception as exc:
            if owed is not None and as_redis_refusal(exc, client_url(self.gate.client)):
                # The answer is paid for whatever becomes of the turn: its usage record (keyed
                # by the call, so counted once) is sent once Redis is back, by a thread of its
                # own, instead of being dropped with the failed call.
                OWED_USAGE.owe(self.gate.client, owed)
            raise
        if owed is not None and isinstance(self.model, MeteredModel):
            self.model.settle(replies[0])
        if breaker is not None:
            breaker.recorded(self.provider, replies[-1])

    def _send(self, calls: Sequence[ScriptCall]) -> list[object]:
        """Send an answered call's writes, waiting up to ``settle_wait`` for a Redis that
        refuses them (down or full); raise once it has refused that long."""
        clock = self.gate.clock
        client = self.gate.client
        deadline = clock.monotonic() + self.settle_wait
        pause = 0.05
        while True:
            try:
                return run_scripts(client, calls)
            except Exception as exc:
                left = deadline - clock.monotonic()
                if left <= 0 or as_redis_refusal(exc, client_url(client)) is None:
                    raise
                _log.warning("usage.record_retry", provider=self.provider, error=str(exc)[:300])
                clock.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)

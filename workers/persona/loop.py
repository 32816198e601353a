"""The tool loop: one turn of model <-> tools, bounded by a :class:`Budget`.

It takes plain arguments (a system prompt, a prompt, tools, a model) and knows nothing of
persona directories, Redis or Celery, so the one-shot ``run``, the in-process heartbeat driver
and the fleet's turn executor all run exactly the same loop.

Why it never raises for the model's or a tool's mistakes: a turn should end with a result the
host can record (``done`` / ``incomplete`` / ``error``) and a well-formed transcript, not a
stack trace. Tool trouble (an unknown tool, arguments that are not JSON, a tool that raises)
becomes an error tool result the model sees and can recover from. A failed model call ends the
turn with status ``error``; a budget limit with ``incomplete`` naming the limit. The only
exception that escapes is :class:`~workers.persona.errors.TurnAborted`, raised by ``guard`` when
the host has lost the right to go on writing (the fleet's lost lease): that must stop the turn
before its next write, not be recorded as a result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import structlog

from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import ModelError, TurnAborted, TurnTimeUp
from workers.persona.messages import Message, ToolCall, Usage
from workers.persona.models import Model
from workers.persona.reply_cap import cap_completion, oversize_result
from workers.persona.session import estimate_tokens
from workers.persona.tools import Tool, ToolResult, spec_of, tool_source
from workers.persona.turn_time import turn_deadline
from workers.persona.waits import waiting
from workers.persona.well_formed import well_formed, well_formed_completion

__all__ = ["Budget", "Limit", "RunResult", "Status", "run_loop", "set_tool_call_observer"]

Status = Literal["done", "incomplete", "error"]
Limit = Literal["max_model_calls", "max_tool_calls", "max_tokens", "max_seconds"]

_log = structlog.get_logger("soulfleet.loop")
_MAX_SHOWN_ARGS = 200

#: (source, outcome, seconds) of every tool call; the fleet points it at its metrics.
ToolCallObserver = Callable[[str, str, float], None]


class _Observer:
    """The process's tool-call observer (a class attribute rather than a module global)."""

    current: ToolCallObserver | None = None


def set_tool_call_observer(observer: ToolCallObserver | None) -> None:
    """Report every tool call's source, outcome and duration to ``observer`` (None: nobody)."""
    _Observer.current = observer


def observe_tool_outcome(source: str, outcome: str, seconds: float = 0.0) -> None:
    """Report an outcome that is not a call the loop made (a server left out of a turn)."""
    observer = _Observer.current
    if observer is not None:
        observer(source, outcome, seconds)


@dataclass(frozen=True, slots=True)
class Budget:
    """Per-turn limits. Model calls, tokens and wall time are checked before each model call;
    tool calls before each tool call."""

    max_model_calls: int = 24
    max_tool_calls: int = 64
    max_tokens: int = 400_000
    max_seconds: float = 600.0
    #: The most bytes one model reply may put anywhere (transcript, Redis, a tool): see
    #: :mod:`workers.persona.reply_cap`.
    max_reply_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        if self.max_reply_bytes < 1:
            raise ValueError("Budget.max_reply_bytes must be >= 1")
        for name in ("max_model_calls", "max_tool_calls", "max_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"Budget.{name} must be >= 0")
        if not self.max_seconds >= 0:
            raise ValueError("Budget.max_seconds must be >= 0")


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a turn ended.

    ``text`` is the final assistant text (for ``incomplete``, the latest text so far).
    ``messages`` is the whole turn: the user message, every assistant message and every tool
    message, in order. ``limit`` names the budget limit of an ``incomplete`` turn; ``error``
    says what failed in an ``error`` turn.
    """

    text: str
    status: Status
    usage: Usage
    messages: tuple[Message, ...]
    limit: Limit | None = None
    error: str | None = None
    model_calls: int = 0
    tool_calls: int = 0
    #: the exception behind an ``error`` result, so the host can tell its kind
    #: (:func:`workers.persona.errors.failure_kind`) without parsing ``error``
    cause: BaseException | None = None


class _Turn:
    """The mutable state of one loop; kept out of run_loop so each step reads as one idea."""

    def __init__(
        self,
        *,
        tools: Sequence[Tool],
        budget: Budget,
        clock: Clock,
        on_message: Callable[[Message], None] | None,
        guard: Callable[[], None] | None,
        persona: str | None = None,
    ) -> None:
        self.persona = persona
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            self.tools.setdefault(tool.name, tool)
        self.budget = budget
        self.clock = clock
        self.on_message = on_message
        self.guard = guard
        self.messages: list[Message] = []
        self.usage = Usage()
        self.model_calls = 0
        self.tool_calls = 0
        self.text = ""
        self.started = clock.monotonic()

    def check(self) -> None:
        if self.guard is not None:
            self.guard()

    def emit(self, message: Message) -> None:
        self.check()
        self.messages.append(message)
        if self.on_message is not None:
            self.on_message(message)

    def seconds_left(self) -> float:
        """What is left of ``max_seconds`` on the turn's clock (<= 0: the time is up)."""
        return self.budget.max_seconds - (self.clock.monotonic() - self.started)

    def model_limit(self) -> Limit | None:
        if self.model_calls >= self.budget.max_model_calls:
            return "max_model_calls"
        if self.usage.total_tokens >= self.budget.max_tokens:
            return "max_tokens"
        if self.seconds_left() <= 0:
            return "max_seconds"
        return None

    def result(
        self,
        status: Status,
        *,
        limit: Limit | None = None,
        error: str | None = None,
        cause: BaseException | None = None,
    ) -> RunResult:
        return RunResult(
            text=self.text,
            status=status,
            usage=self.usage,
            messages=tuple(self.messages),
            limit=limit,
            error=error,
            model_calls=self.model_calls,
            tool_calls=self.tool_calls,
            cause=cause,
        )

    def execute(self, call: ToolCall) -> ToolResult:
        """Run one call and report it (``tool.call`` log event, the observer)."""
        tool = self.tools.get(call.name)
        started = time.perf_counter()
        result = self._execute(tool, call)
        seconds = time.perf_counter() - started
        source = "unknown" if tool is None else tool_source(tool)
        outcome = "ok" if not result.is_error else (result.failure or "error")
        _log.info(
            "tool.call",
            persona=self.persona,
            tool=call.name,
            source=source,
            outcome=outcome,
            seconds=round(seconds, 4),
            result_bytes=len(result.output.encode("utf-8")),
        )
        observer = _Observer.current
        if observer is not None:
            observer(source, outcome, seconds)
        return result

    def _execute(self, tool: Tool | None, call: ToolCall) -> ToolResult:
        if tool is None:
            names = ", ".join(self.tools) or "none"
            return ToolResult(
                f"error: unknown tool {call.name!r}; available tools: {names}", True, "unknown_tool"
            )
        oversize = oversize_result(call, self.budget.max_reply_bytes)
        if oversize is not None:
            return oversize
        if call.raw_arguments is not None:
            shown = call.raw_arguments[:_MAX_SHOWN_ARGS]
            return ToolResult(
                f"error: the arguments for tool {call.name!r} are not a JSON object "
                f"({shown!r}); call it again with a JSON object matching its input schema",
                True,
                "bad_arguments",
            )
        left = self.seconds_left()
        if left <= 0:
            return ToolResult(
                f"error: tool {call.name!r} was not called: the turn's time "
                f"({self.budget.max_seconds:g}s) is up",
                True,
                "timeout",
            )
        try:
            with turn_deadline(left), waiting():  # a tool may wait on a lock, a server...
                return tool.execute(call.arguments)
        except TurnAborted:
            raise
        except Exception as exc:
            _log.warning("tool.raised", tool=call.name, error=type(exc).__name__)
            return ToolResult(
                f"error: tool {call.name!r} failed: {type(exc).__name__}: {exc}", True, "raised"
            )

    def tool_message(self, call: ToolCall, result: ToolResult) -> Message:
        return Message(
            role="tool",
            content=well_formed(result.output, part="tool_result"),
            tool_call_id=call.id,
            name=call.name,
            is_error=result.is_error,
        )


def _budget_log(turn: _Turn, estimate: int) -> None:
    """Why the next call is not made: the turn's own calls used its token budget up (an
    ordinary end), or its input alone is over it (an operator's alarm: every turn repeats it)."""
    figures = {
        "persona": turn.persona,
        "estimated_input_tokens": estimate,
        "used": turn.usage.total_tokens,
        "max_tokens": turn.budget.max_tokens,
    }
    if turn.model_calls:
        _log.info("turn.token_budget_reached", **figures)
        return
    _log.warning(
        "turn.input_over_budget",
        **figures,
        error="the next model call's input alone would exceed the turn's token budget, so it "
        "was not made: shrink the soul (MEMORY.md, or memory_index_cap) or the history, or "
        "raise SOULFLEET_TURN_MAX_TOKENS; when the history is what is over, `soulfleet session "
        "reset PERSONA` starts a new session (a soul over the budget starts one by itself)",
    )


def run_loop(
    *,
    system: str,
    prompt: str,
    tools: Sequence[Tool],
    model: Model,
    budget: Budget,
    clock: Clock | None = None,
    on_message: Callable[[Message], None] | None = None,
    guard: Callable[[], None] | None = None,
    persona: str | None = None,
    history: Sequence[Message] = (),
) -> RunResult:
    """Run one turn: ``prompt`` in, model and tools in turn until the model answers plainly.

    ``history`` (a session's committed messages) is sent before the turn's own messages on
    every model call; it is not part of the result's ``messages``, which hold this turn only.
    ``tools`` are offered in the given order. ``on_message`` sees every message as it is made
    (the transcript writer); ``guard`` runs before every tool call and every ``on_message`` and
    may raise TurnAborted, which propagates. ``persona`` names the agent in ``tool.call`` logs.
    """
    turn = _Turn(
        tools=tools,
        budget=budget,
        clock=clock or SystemClock(),
        on_message=on_message,
        guard=guard,
        persona=persona,
    )
    specs = [spec_of(tool) for tool in turn.tools.values()]
    before = tuple(history)
    # The soul and history are sent on every call: estimated once (chars / 4, which rather
    # underestimates than over), so a call whose input alone would exceed the budget is never
    # made: the token budget was only checked after a call, and a 3 MB soul was sent whole.
    sent_every_call = estimate_tokens(before, system)
    turn.emit(Message(role="user", content=prompt))
    while True:
        limit = turn.model_limit()
        if limit is None:
            estimate = sent_every_call + estimate_tokens(turn.messages)
            if turn.usage.total_tokens + estimate > budget.max_tokens:
                limit = "max_tokens"
                _budget_log(turn, estimate)
        if limit is not None:
            _log.info("turn.incomplete", limit=limit, model_calls=turn.model_calls)
            return turn.result("incomplete", limit=limit)
        # The gate wait, the client's tries and retries end by the turn's limit (turn_time.py).
        try:
            with (
                turn_deadline(turn.seconds_left()),
                waiting(),
            ):  # other turns run while the model answers
                completion = model.complete(
                    system=system, messages=(*before, *turn.messages), tools=specs
                )
        except TurnTimeUp:
            _log.info("turn.incomplete", limit="max_seconds", model_calls=turn.model_calls)
            return turn.result("incomplete", limit="max_seconds")
        except ModelError as exc:
            _log.warning("turn.model_error", model=model.spec, error=type(exc).__name__)
            return turn.result(
                "error", error=f"model call failed ({type(exc).__name__}): {exc}", cause=exc
            )
        turn.model_calls += 1
        completion = cap_completion(well_formed_completion(completion), budget.max_reply_bytes)
        turn.usage = turn.usage + completion.usage
        turn.text = completion.text
        turn.emit(completion.as_message())
        if not completion.tool_calls:
            return turn.result("done")
        for n, call in enumerate(completion.tool_calls):
            turn.check()
            if turn.tool_calls >= budget.max_tool_calls:
                refused = ToolResult(
                    f"not run: budget (max_tool_calls={budget.max_tool_calls}) reached", True
                )
                for skipped in completion.tool_calls[n:]:
                    turn.emit(turn.tool_message(skipped, refused))
                _log.info("turn.incomplete", limit="max_tool_calls", tool_calls=turn.tool_calls)
                return turn.result("incomplete", limit="max_tool_calls")
            turn.tool_calls += 1
            turn.emit(turn.tool_message(call, turn.execute(call)))

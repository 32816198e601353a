"""GatedModel with a call log: what a retry replaying its answers must not get wrong."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis

from tests.support.persona import make_persona
from workers.fleet.gate import Gate, GatedModel
from workers.fleet.keys import Keys
from workers.persona.call_log import CallLog
from workers.persona.errors import ModelError, ModelRequestError
from workers.persona.loop import Budget, RunResult, run_loop
from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.tools import ToolResult


class _Echo:
    name = "echo"
    description = "echo"
    input_schema: Mapping[str, Any] = {"type": "object"}

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult("ok", False)


class _Provider:
    """Answers every call with a tool call costing 100 tokens; fails the calls listed in
    ``fail_at`` (1-based, counted over its whole life) with ``error``."""

    spec = "fake:model"

    def __init__(self, fail_at: Sequence[int] = (), error: ModelError | None = None) -> None:
        self.calls = 0
        self.fail_at = set(fail_at)
        self.error = error or ModelError("provider down")

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        self.calls += 1
        if self.calls in self.fail_at:
            raise self.error
        call = ToolCall(f"c{self.calls}", "echo", {"n": self.calls})
        return Completion("", (call,), Usage(90, 10), "tool")


def _attempt(home: Path, provider: _Provider, budget: Budget) -> RunResult:
    gate = Gate(redis.Redis(port=1), Keys("review:"), limit=0, slot_ttl=10.0)
    model = GatedModel(provider, gate, provider="fake", calls=CallLog(home, "ava", "ava:1:0"))
    return run_loop(system="soul", prompt="go", tools=[_Echo()], model=model, budget=budget)


def test_a_retry_keeps_to_the_turns_token_budget(tmp_path: Path) -> None:
    """A turn's max_tokens bounds the conversation it builds: without a failure this turn stops
    after 3 calls (300 tokens of a 250 budget). A retry replays the first 2 calls at zero
    usage, so its loop believes 200 tokens are still unspent and runs on to 5 calls: the
    committed turn is twice what its budget allows (and its reported usage hides 200)."""
    home = make_persona(tmp_path / "ava")
    budget = Budget(max_tokens=250, max_model_calls=20)
    clean = _attempt(make_persona(tmp_path / "bob"), _Provider(), budget)
    assert clean.limit == "max_tokens"
    assert clean.model_calls == 3

    provider = _Provider(fail_at=[3])
    failed = _attempt(home, provider, budget)
    assert failed.status == "error"
    retried = _attempt(home, provider, budget)
    assert retried.limit == "max_tokens"
    assert retried.model_calls == clean.model_calls
    assert retried.usage.total_tokens == clean.usage.total_tokens


def test_an_answer_the_provider_refused_to_build_on_is_not_replayed(tmp_path: Path) -> None:
    """The provider refuses (a 400: permanent, dead-lettered at once) the request built on the
    answer the attempt bought. After `soulfleet revive` the lane runs the same work again:
    replaying that answer sends the very request refused before, so the revived turn can
    never succeed; it must ask again."""
    home = make_persona(tmp_path / "ava")
    provider = _Provider(fail_at=[2], error=ModelRequestError("400: invalid tool arguments"))
    failed = _attempt(home, provider, Budget(max_model_calls=2))
    assert failed.status == "error"
    before = provider.calls
    _attempt(home, provider, Budget(max_model_calls=1))
    assert provider.calls == before + 1  # the first call was asked again, not replayed

"""What a turn runs with: its agent (the persona, or its dreamer), the tools its persona.toml
declares, and its model wrapped for the fleet (metered per answered call, behind the turn gate
and the provider breaker). Also the runtime's side of a dream pass: logging what a dream did
when the model did not.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import structlog

from workers.fleet import Fleet
from workers.fleet.gate import Gate, GatedModel
from workers.fleet.spend import SpendGuard
from workers.fleet.usage import MeteredModel
from workers.persona.agent import AgentDef
from workers.persona.call_log import CallLog
from workers.persona.dream_agent import dreamer
from workers.persona.loop import Budget, RunResult
from workers.persona.mcp_hub import McpHub
from workers.persona.memory import memory_tool
from workers.persona.models import Model
from workers.persona.models.spec import provider_of
from workers.persona.toolbox import ToolLimits, build_within
from workers.persona.tools import Tool
from workers.persona.transcripts import FileTranscripts
from workers.settings import Settings

__all__ = ["TurnKit", "paused", "wrote_log"]

_log = structlog.get_logger("soulfleet.turn")


class TurnKit:
    """Builds each turn's agent, tools and model for one worker process. Thread-safe."""

    def __init__(self, settings: Settings, fleet: Fleet, gate: Gate, guard: SpendGuard) -> None:
        self.settings = settings
        self.fleet = fleet
        self.gate = gate
        # The offline scripted model takes no gate slot (see model()).
        self.open_gate = Gate(
            gate.client, gate.keys, limit=0, slot_ttl=gate.slot_ttl, clock=gate.clock
        )
        self.guard = guard
        # One hub per worker process: every turn's MCP calls share its sessions.
        self.tool_hub = McpHub()
        self.tool_limits = ToolLimits(
            max_args_bytes=settings.tool_args_max_bytes,
            max_result_bytes=settings.tool_result_max_bytes,
        )

    def agent(self, persona: AgentDef, role: str, spec: str) -> AgentDef:
        if role != "dreamer":
            return replace(persona, model=spec)
        return dreamer(
            persona.home,
            store=FileTranscripts(persona.home, lanes=[persona.name]),
            instructions=persona.dream.instructions if persona.dream else None,
            model=spec,
        )

    def declared(
        self, agent: AgentDef, role: str, budget: Budget
    ) -> tuple[tuple[Tool, ...], Budget]:
        """The persona's persona.toml tools (a dreamer never gets them: docs/persona.md §4),
        and ``budget`` less the time their servers took to start: the turn's ``max_seconds``
        covers the wait for them too, so a server that hangs at start cannot stretch it."""
        if role == "dreamer" or not agent.declared.entries:
            return (), budget
        box, left = build_within(
            agent.declared,
            budget,
            hub=self.tool_hub,
            fleet=self.settings.mcp_servers,
            limits=self.tool_limits,
            reserved=("memory",) if agent.memory else (),
        )
        box.warn_unavailable(agent.name)
        return box.tools, left

    def model(
        self,
        resolved: Model,
        kind: str,
        call_prefix: str,
        persona: AgentDef,
        *,
        calls: CallLog | None = None,
        lane: str = "",
    ) -> GatedModel:
        """``resolved`` (the turn start resolved it once), metered and behind the gate;
        ``calls``: the answers the turn's work bought (a paid provider's only); ``lane``: whose
        calls they are (named in their gate slots)."""
        provider = provider_of(resolved)
        # Every answered call is counted as it returns: a turn that later fails or dies was
        # still billed for it (workers/fleet/usage.py).
        model = MeteredModel(
            resolved,
            self.fleet.ledger,
            persona=persona.name,
            day=self.guard.day(persona),
            call_prefix=call_prefix,
            kind=kind,
            provider=provider,
        )
        # An answered call's usage record waits out a Redis blip rather than lose the paid
        # answer: for half a lease, well inside what the lease itself survives.
        settle_wait = self.settings.lease_ttl / 2
        # The gate protects a provider's rate limits; the offline scripted model has none, so it
        # skips the two Redis round trips a slot costs (the wrapper still times the call).
        if provider == "scripted":
            return GatedModel(model, self.open_gate, provider=provider, settle_wait=settle_wait)
        return GatedModel(
            model,
            self.gate,
            provider=provider,
            timeout=self.settings.turn_max_seconds,
            breaker=self.fleet.breaker,
            settle_wait=settle_wait,
            calls=calls,
            lane=lane,
        )

    def log_dream(self, agent: AgentDef, turn_id: str, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.fleet.clock.time()))
        summary = " ".join(text.split())[:500]
        tool = memory_tool(
            agent.home,
            notes=True,
            lock_mode=self.settings.lock_mode,
            lock_timeout=self.settings.lock_timeout,
        )
        entry = f"{stamp} {turn_id}: {summary}"
        written = tool.execute({"action": "add", "target": "note:log", "text": entry})
        if written.is_error:  # the pass still counts; the operator hears why it went unlogged
            _log.warning("dream.log_not_written", persona=agent.name, error=written.output[:300])


def _memory_calls(result: RunResult) -> list[Mapping[str, Any]]:
    """The arguments of the pass's memory tool calls that succeeded."""
    succeeded = {
        message.tool_call_id for message in result.messages
        if message.role == "tool" and not message.is_error
    }  # fmt: skip
    return [
        call.arguments
        for message in result.messages
        for call in message.tool_calls
        if call.name == "memory" and call.id in succeeded
    ]


def wrote_log(result: RunResult) -> bool:
    """Whether the pass itself wrote to its log: an add or replace on ``note:log`` that
    succeeded (reading it, as the dream prompt's first step does, or a refused write, is not)."""
    return any(
        args.get("target") == "note:log" and args.get("action") in ("add", "replace")
        for args in _memory_calls(result)
    )


def wrote_memory(result: RunResult) -> bool:
    """Whether the pass changed memory: a memory add, replace or remove that succeeded."""
    return any(args.get("action") in ("add", "replace", "remove") for args in _memory_calls(result))


def paused(model: GatedModel) -> bool:
    """Whether the model's provider breaker holds the turn back now (one read); a breaker seen
    closed also admits the model's first call (:meth:`GatedModel.seen_closed`)."""
    if model.breaker is None:
        return False
    seen = model.breaker.look(model.provider)
    if seen == "closed":
        model.seen_closed()
    return seen == "paused"

"""One-shot runs: a persona directory and a prompt in, a :class:`RunResult` out (§5 of
docs/persona.md).

``run`` is the synchronous, in-process way to use a persona; ``as_tool`` turns a persona into a
tool another agent can call. Both rebuild the agent from its directory on every call, so an edit
to persona.toml or a bootstrap file applies to the next call, and neither ever dreams.

:func:`run_agent` is the in-process turn recipe (``run`` and the heartbeat driver): plan the
turn against the lane's session (:mod:`workers.persona.session_plan`: continue it with its
frozen soul and history, or start a new one and compose the soul now), build the tools, record
the turn in the session's durable transcript, run the loop with the transcript writer as
``on_message``, and commit the new session state unless the turn failed.

Sessions (``session=``): ``False`` (the default) is a one-shot run in a session of its own,
never stored; ``True`` continues the lane's session kept in the persona's home under the
persona's ``[session]`` rules; ``"new"`` ends that session first and starts a new one.

Model choice, first that applies: the explicit ``model`` argument (a spec string or a Model);
the persona's ``model`` in persona.toml unless ``"inherit"``; ``SOULFLEET_MODEL``; the built-in
scripted model. ``"inherit"`` (or an empty string) at any level defers to the next.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

import structlog

from workers.persona.agent import AgentDef, from_dir
from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import SoulfleetError, TurnAborted
from workers.persona.heartbeat import is_silent
from workers.persona.locks import LockMode
from workers.persona.loop import Budget, RunResult, run_loop
from workers.persona.mcp_hub import McpHub
from workers.persona.mcp_servers import FleetServer
from workers.persona.models import Model
from workers.persona.models.config import ModelConfig
from workers.persona.models.spec import inherits, resolve_model
from workers.persona.session_files import FilePointer, SessionFiles, library_tag
from workers.persona.session_plan import SessionPlan, ephemeral_plan, plan_turn
from workers.persona.summary_cache import SummaryFile
from workers.persona.toolbox import build_within
from workers.persona.tools import Tool, ToolResult
from workers.persona.transcript_layout import local_lane
from workers.persona.transcripts import FileTranscripts
from workers.persona.turn_time import turn_deadline

__all__ = ["PersonaTool", "SessionMode", "as_tool", "model_for", "run", "run_agent"]

_log = structlog.get_logger("soulfleet.run")

ModelChoice = str | Model | None
#: False: one-shot; True: continue the lane's session; "new": start a new session.
SessionMode = bool | Literal["new"]


def model_for(
    agent: AgentDef, model: ModelChoice = None, *, config: ModelConfig | None = None
) -> Model:
    """The model a turn of ``agent`` uses (precedence in the module docstring)."""
    if model is not None and not isinstance(model, str):
        return model
    # Whether this process can reach the DEFAULT model (SOULFLEET_MODEL's key) matters only
    # when the default is the one used: a persona with its own model ran nowhere while an
    # unrelated default lacked its key.
    settings = config if config is not None else ModelConfig.from_env(reach=False)
    if model is not None and not inherits(model):
        return resolve_model(model, settings)
    if not inherits(agent.model):
        # persona.toml's relative scripted paths mean the persona's own directory.
        return resolve_model(agent.model, settings, base_dir=agent.home)
    if config is None:
        settings = ModelConfig.from_env()  # the default is used: raises what keeps it away
    return resolve_model(None, settings)


def run_agent(
    agent: AgentDef,
    prompt: str,
    *,
    model: Model,
    budget: Budget | None = None,
    clock: Clock | None = None,
    guard: Callable[[], None] | None = None,
    lock_mode: LockMode = "local",
    lock_timeout: float = 10.0,
    max_conversations: int = 1000,
    declared: Sequence[Tool] = (),
    session: SessionMode = False,
    beat: bool = False,
) -> RunResult:
    """One turn of ``agent`` on ``prompt`` (module doc).

    ``declared`` are the persona's persona.toml tools, already built (:func:`run` builds them).
    ``beat``: the turn was woken by heartbeat ticks only, so a ``HEARTBEAT_OK`` reply leaves
    nothing in the session.
    """
    if session not in (False, True, "new"):
        raise ValueError(f"session must be False, True or 'new', got {session!r}")
    used_clock: Clock = clock if clock is not None else SystemClock()
    limits = budget if budget is not None else Budget()
    began = used_clock.monotonic()
    tools = agent.toolset(lock_mode=lock_mode, lock_timeout=lock_timeout, declared=declared)
    lane = local_lane(agent.name)
    pointer: FilePointer | None = None
    if session and agent.kind != "dreamer":
        files = SessionFiles(agent.home, lane)
        pointer = FilePointer(files, lock_mode=lock_mode, lock_timeout=lock_timeout)
        if session == "new":
            pointer.reset()
        at = pointer.read()
        # A summary may take half the turn's max_seconds, as in a fleet turn (executor.py).
        with turn_deadline(limits.max_seconds / 2):
            plan = plan_turn(
                lane=lane,
                pointer=at,
                base=files.read(at.state),
                compose=agent.soul,
                config=agent.session,
                now=used_clock.time(),
                incoming=prompt,
                model=model,
                turn_tokens=limits.max_tokens,
                summaries=SummaryFile(agent.home, lane),
            )
    else:
        plan = ephemeral_plan(lane, agent.soul, now=used_clock.time())
    store = FileTranscripts(agent.home, max_conversations=max_conversations, clock=used_clock)
    writer = store.open(lane=lane, conversation_id=plan.session_id)
    started = used_clock.monotonic()
    _log.debug(
        "turn.start",
        lane=lane,
        session=plan.session_id,
        session_reason=plan.reason,
        history=len(plan.history),
        sections=list(plan.sections),
        model=model.spec,
    )
    result = plan.charge(
        run_loop(
            system=plan.soul,
            prompt=prompt,
            tools=tools,
            model=model,
            budget=replace(
                plan.left_of(limits),
                max_seconds=max(0.0, limits.max_seconds - (used_clock.monotonic() - began)),
            ),
            clock=used_clock,
            on_message=writer.append,
            guard=guard,
            persona=agent.name,
            history=plan.history,
        )
    )
    if pointer is not None and result.status != "error":
        _commit(plan, pointer, result, beat=beat)
    _log.debug(
        "turn.end",
        lane=lane,
        session=plan.session_id,
        status=result.status,
        limit=result.limit,
        model_calls=result.model_calls,
        tool_calls=result.tool_calls,
        usage=result.usage.to_dict(),
        seconds=round(used_clock.monotonic() - started, 6),
    )
    return result


def _commit(plan: SessionPlan, pointer: FilePointer, result: RunResult, *, beat: bool) -> None:
    state = plan.conclude(result.messages, silent_beat=beat and is_silent(result.text))
    if state is None:
        return
    files = pointer.files
    name = files.write(state, library_tag())
    if pointer.commit(plan.pointer, name):
        files.collect({name, plan.pointer.state or ""}, tag_prefix="l", committed=name)
    else:
        # Another process committed or reset meanwhile: its state wins, ours is dropped.
        _log.warning("session.commit_conflict", lane=plan.lane, session=plan.session_id)
        files.discard(name)


def run(
    path: str | os.PathLike[str],
    prompt: str,
    model: ModelChoice = None,
    budget: Budget | None = None,
    *,
    clock: Clock | None = None,
    mcp_servers: Mapping[str, FleetServer] | None = None,
    session: SessionMode = False,
    lock_mode: LockMode = "local",
    lock_timeout: float = 10.0,
    max_conversations: int = 1000,
) -> RunResult:
    """Run the persona at ``path`` once on ``prompt`` (synchronous; never dreams).

    ``session``: False (default) runs it one-shot; True continues the persona's session kept in
    its home (``<dir>/sessions/<name>/``), so the model sees the conversation so far; "new"
    starts a new session first.

    The persona's declared tools (persona.toml ``[tools]``) are built for this run: its MCP
    servers are started, and stopped when the run ends. ``mcp_servers`` are the fleet servers a
    ``use`` may name (the CLI passes ``SOULFLEET_MCP_CONFIG``'s). ``lock_mode`` and
    ``lock_timeout`` are the memory locks' (the CLI passes ``SOULFLEET_LOCK_MODE``'s: a
    persona on a shared filesystem must lock as the fleet's workers do). ``max_conversations``
    is how many transcripts the persona keeps (the CLI passes
    ``SOULFLEET_TRANSCRIPT_MAX_CONVERSATIONS``, as the fleet's workers use it).

    Raises PersonaNotFound / PersonaConfigError for an unusable directory or tool configuration
    and ModelSpecError for a model spec naming no model; everything that goes wrong during the
    turn is in the result (``status`` "error" or "incomplete").
    """
    agent = from_dir(path)
    chosen = model_for(agent, model)
    if not agent.declared.entries:
        return run_agent(
            agent, prompt, model=chosen, budget=budget, clock=clock, session=session,
            lock_mode=lock_mode, lock_timeout=lock_timeout, max_conversations=max_conversations,
        )  # fmt: skip
    hub = McpHub()
    try:
        box, budget = build_within(
            agent.declared,
            budget or Budget(),
            hub=hub,
            fleet=mcp_servers,
            reserved=("memory",) if agent.memory else (),
        )
        box.warn_unavailable(agent.name)
        return run_agent(
            agent,
            prompt,
            model=chosen,
            budget=budget,
            clock=clock,
            declared=box.tools,
            session=session,
            lock_mode=lock_mode,
            lock_timeout=lock_timeout,
            max_conversations=max_conversations,
        )
    finally:
        hub.close()


_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "prompt": {
            "type": "string",
            "description": "What to ask or tell the persona, in plain words.",
        }
    },
    "required": ["prompt"],
    "additionalProperties": False,
}


class PersonaTool:
    """A persona as a tool: ``{prompt}`` in, the persona's final text out. See :func:`as_tool`."""

    def __init__(
        self, path: str | os.PathLike[str], *, model: ModelChoice, budget: Budget | None
    ) -> None:
        agent = from_dir(path)
        self._path = path
        self._model = model
        self._budget = budget
        self._name = agent.name
        self._description = agent.does.strip() or (
            f"Ask the persona {agent.name!r} (a file-defined agent with its own memory) to "
            "answer or act on a prompt; it replies with its final answer."
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        return self._description

    @property
    def input_schema(self) -> Mapping[str, Any]:
        return _SCHEMA

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        prompt = arguments.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return ToolResult(
                f"error: {self._name} needs a non-empty string argument 'prompt', e.g. "
                '{"prompt": "What is on my plate today?"}',
                is_error=True,
            )
        try:
            result = run(self._path, prompt, self._model, self._budget)
        except TurnAborted:
            raise
        except SoulfleetError as exc:
            return ToolResult(f"error: {self._name} could not run: {exc}", is_error=True)
        if result.status == "done":
            return ToolResult(result.text)
        if result.status == "incomplete":
            partial = f" Its latest text: {result.text}" if result.text.strip() else ""
            return ToolResult(
                f"error: {self._name} stopped before finishing: it reached its "
                f"{result.limit} budget limit.{partial}",
                is_error=True,
            )
        return ToolResult(f"error: {self._name} could not answer: {result.error}", is_error=True)


def as_tool(
    path: str | os.PathLike[str], model: ModelChoice = None, budget: Budget | None = None
) -> PersonaTool:
    """The persona at ``path`` as a :class:`~workers.persona.tools.Tool` (never dreams).

    Name: the persona's name. Description: its ``does`` (or a sensible default). Each call runs
    the persona once, from its directory as it is then.
    """
    return PersonaTool(path, model=model, budget=budget)

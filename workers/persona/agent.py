"""The persona as an agent definition: a frozen value built from a directory (docs/persona.md §5).

There is no Agent object with behaviour to learn: :class:`AgentDef` is plain data (who, where,
which model, which tools, which schedules), and the runtimes (one-shot ``run``, ``as_tool``, the
in-process driver, the fleet) all read the same value. Two things are deliberately NOT frozen
into it:

* the soul: :meth:`AgentDef.soul` composes from disk when called, once per session (the
  session then keeps that snapshot frozen, see :mod:`workers.persona.session`), so a person
  editing SOUL.md (or the persona editing MEMORY.md) is picked up by the next session without
  rebuilding anything;
* the memory tool: :meth:`AgentDef.toolset` builds it per call, so the lock mode and timeout come
  from the runtime that will execute the writes, not from whoever built the definition.

Defaults come from the optional ``persona.toml`` (:mod:`workers.persona.manifest`); keyword
overrides passed to :func:`from_dir` win over it. The fleet calls :func:`from_dir` on every
turn; the parsed file is reused while its inode, size and times are unchanged
(:mod:`workers.persona.definitions`), so an edit is still obeyed by the next turn.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from workers.persona.definitions import DEFINITIONS_MAX, definitions
from workers.persona.dream_soul import dream_soul
from workers.persona.home import CapSpec, compose_soul, resolve_index_cap
from workers.persona.locks import LockMode
from workers.persona.manifest import PersonaConfig
from workers.persona.memory import memory_tool
from workers.persona.schedules import DreamSchedule, HeartbeatSchedule
from workers.persona.search import transcript_search_tool
from workers.persona.session import SessionConfig
from workers.persona.spend import DailyBudget
from workers.persona.tool_config import ToolsConfig
from workers.persona.tools import Tool
from workers.persona.transcripts import TranscriptStore

__all__ = ["AgentDef", "AgentKind", "default_name", "from_dir"]

AgentKind = Literal["persona", "dreamer"]


@dataclass(frozen=True)
class AgentDef:
    """One agent: a persona (``kind="persona"``) or a persona's dreamer (``kind="dreamer"``).

    ``tools`` are the extra tools, offered BEFORE ``memory``. ``declared`` is what persona.toml
    declares under ``[tools]``; building those tools needs a runtime (MCP servers to start), so
    it stays configuration here and a runtime passes the built tools to :meth:`toolset`.
    ``instructions`` and ``store`` are used by dreamers only (see
    :func:`workers.persona.dream_agent.dreamer`).
    """

    name: str
    home: Path
    does: str
    model: str
    tools: tuple[Tool, ...]
    memory: bool
    notes: bool
    memory_index_cap: CapSpec
    heartbeat: HeartbeatSchedule | None
    dream: DreamSchedule | None
    kind: AgentKind = "persona"
    instructions: str | None = None
    store: TranscriptStore | None = None
    declared: ToolsConfig = field(default_factory=ToolsConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    #: ``[budget]`` from persona.toml (None: the fleet's SOULFLEET_DAILY_TOKENS, if any).
    budget: DailyBudget | None = None

    def soul(self) -> tuple[str, list[str]]:
        """``(soul, found)`` composed from disk NOW; called once at the start of each session
        (and of each one-shot run or dream pass): the session then keeps it frozen."""
        if self.kind == "dreamer":
            return dream_soul(self.home, self.instructions)
        return compose_soul(self.home, memory_index_cap=self.memory_index_cap, notes=self.notes)

    def toolset(
        self,
        *,
        lock_mode: LockMode = "local",
        lock_timeout: float = 10.0,
        declared: Sequence[Tool] = (),
        write_scope: str | None = None,
    ) -> tuple[Tool, ...]:
        """The tools a turn offers, in order.

        A persona: its extra tools, then its ``declared`` tools (built from persona.toml by the
        runtime, :func:`workers.persona.toolbox.build_declared`), then ``memory`` unless
        ``memory=False``. A dreamer: EXACTLY ``memory`` (notes on) and ``transcript_search``
        over its store, whatever is passed. ``write_scope`` keys the memory tool's writes (a
        fleet turn's work id): see :mod:`workers.persona.ledger`.
        """
        if self.kind == "dreamer":
            if self.store is None:
                raise ValueError(f"dreamer {self.name!r} has no transcript store")
            return (
                memory_tool(
                    self.home,
                    notes=True,
                    lock_mode=lock_mode,
                    lock_timeout=lock_timeout,
                    write_scope=write_scope,
                ),
                transcript_search_tool(self.store),
            )
        tools = (*self.tools, *declared)
        if not self.memory:
            return tools
        memory = memory_tool(
            self.home,
            notes=self.notes,
            lock_mode=lock_mode,
            lock_timeout=lock_timeout,
            write_scope=write_scope,
        )
        return (*tools, memory)


def default_name(path: str | os.PathLike[str]) -> str:
    """The directory's last segment as given (``./personas/ava/`` -> ``ava``); no link following."""
    name = os.path.basename(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if not name:
        raise ValueError(f"cannot derive an agent name from {os.fspath(path)!r}; pass name=")
    return name


class _Unset(enum.Enum):
    """Marks an override that was not passed (None is a real value for several of them)."""

    UNSET = enum.auto()


_UNSET = _Unset.UNSET


def _tools(tools: object) -> tuple[Tool, ...]:
    if isinstance(tools, str | bytes) or not hasattr(tools, "__iter__"):
        raise TypeError(f"tools must be a sequence of tools, got {tools!r}")
    result = tuple(tools)
    for tool in result:
        if not isinstance(tool, Tool):
            raise TypeError(
                f"tools: {tool!r} is not a Tool (name, description, input_schema, execute)"
            )
    return result


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def _check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {value!r}")
    return value


def from_dir(
    path: str | os.PathLike[str],
    *,
    name: str | _Unset = _UNSET,
    does: str | _Unset = _UNSET,
    model: str | _Unset = _UNSET,
    tools: tuple[Tool, ...] | list[Tool] | _Unset = _UNSET,
    memory: bool | _Unset = _UNSET,
    notes: bool | _Unset = _UNSET,
    memory_index_cap: CapSpec | _Unset = _UNSET,
    heartbeat: HeartbeatSchedule | _Unset | None = _UNSET,
    dream: DreamSchedule | _Unset | None = _UNSET,
) -> AgentDef:
    """Build a persona's :class:`AgentDef` from its directory (docs/persona.md §5).

    Defaults: ``name`` is the directory's last segment; everything else comes from
    ``persona.toml`` (absent: ``does=""``, ``model="inherit"``, no extra tools, memory on,
    notes off, no index cap, no heartbeat, no dream). Any keyword given wins over the file;
    an unknown keyword is a TypeError, an invalid persona.toml a PersonaConfigError, a missing
    directory PersonaNotFound. The parse is cached per process while persona.toml is unchanged
    (:mod:`workers.persona.definitions` says how a change is detected, and its one limit).
    """
    home, config = definitions.load(path)
    overrides = (name, does, model, tools, memory, notes, memory_index_cap, heartbeat, dream)
    plain = all(value is _UNSET for value in overrides)
    key = os.fspath(path)
    if plain:
        # The fleet's per-turn call: the same parsed config object means the same definition.
        cached = _PLAIN.get(key)
        if cached is not None and cached[0] is config and cached[1].home == home:
            return cached[1]
    agent = _build(
        path,
        home,
        config,
        name=name,
        does=does,
        model=model,
        tools=tools,
        memory=memory,
        notes=notes,
        memory_index_cap=memory_index_cap,
        heartbeat=heartbeat,
        dream=dream,
    )
    if plain:
        if len(_PLAIN) >= DEFINITIONS_MAX:
            _PLAIN.clear()
        _PLAIN[key] = (config, agent)
    return agent


#: from_dir(path) without overrides, per path: (the config it was built from, the definition).
#: Dict reads and writes are atomic, and an entry is only used with its own config object.
_PLAIN: dict[str, tuple[PersonaConfig, AgentDef]] = {}


def _build(
    path: str | os.PathLike[str],
    home: Path,
    config: PersonaConfig,
    *,
    name: str | _Unset,
    does: str | _Unset,
    model: str | _Unset,
    tools: tuple[Tool, ...] | list[Tool] | _Unset,
    memory: bool | _Unset,
    notes: bool | _Unset,
    memory_index_cap: CapSpec | _Unset,
    heartbeat: HeartbeatSchedule | _Unset | None,
    dream: DreamSchedule | _Unset | None,
) -> AgentDef:
    chosen_name = default_name(path) if isinstance(name, _Unset) else name
    if not isinstance(chosen_name, str) or not chosen_name.strip():
        raise ValueError(f"name must be a non-empty string, got {chosen_name!r}")
    extra = () if isinstance(tools, _Unset) else _tools(tools)
    use_memory = config.memory if isinstance(memory, _Unset) else _check_bool("memory", memory)
    use_notes = config.notes if isinstance(notes, _Unset) else _check_bool("notes", notes)
    # A model calls tools by name: two tools with one name would make one of them unreachable.
    names = [tool.name for tool in extra] + (["memory"] if use_memory else [])
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"tool names must be unique; used more than once: {duplicates}")
    return AgentDef(
        name=chosen_name,
        home=home,
        does=config.does if isinstance(does, _Unset) else _check_str("does", does),
        model=config.model if isinstance(model, _Unset) else _check_str("model", model),
        tools=extra,
        memory=use_memory,
        notes=use_notes,
        memory_index_cap=(
            config.memory_index_cap
            if isinstance(memory_index_cap, _Unset)
            else resolve_index_cap(memory_index_cap)
        ),
        heartbeat=config.heartbeat if isinstance(heartbeat, _Unset) else heartbeat,
        dream=config.dream if isinstance(dream, _Unset) else dream,
        declared=config.tools,
        session=config.session,
        budget=config.budget,
    )

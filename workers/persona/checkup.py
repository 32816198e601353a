"""A persona's check-up: is this directory runnable as it is, and what looks wrong but runs?

Every front door calls it before work is queued (``soulfleet post``/``run``/``dream``, ``up``
listing its personas), because a persona whose files are invalid can only fail its turns, and a
failed turn is retried until the lane is dead-lettered: the operator would learn about a typo
from a dead lane minutes later instead of from the command that queued the work. The check is
exactly what a turn does first: parse ``persona.toml`` (with the one cron parser), compose the
soul, resolve Python tool refs and the model spec. Nothing is written; no provider is called,
no MCP server started.

Invalid is an exception (:class:`~workers.persona.errors.PersonaError` naming the file and key,
or :class:`~workers.persona.errors.ModelSpecError`); odd but runnable is a warning string, such as
a directory with no bootstrap file at all, which runs with an empty soul.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from workers.persona.agent import AgentDef, from_dir
from workers.persona.dream_soul import DREAM_FILE
from workers.persona.errors import ModelSpecError, ToolSetupSlow
from workers.persona.files import confined
from workers.persona.home import BOOTSTRAP_ORDER
from workers.persona.manifest import MANIFEST_NAME
from workers.persona.mcp_servers import FleetServer, check_uses
from workers.persona.models.client import HTTPModel
from workers.persona.models.config import ModelConfig
from workers.persona.models.spec import inherits, resolve_model
from workers.persona.session import estimate_tokens
from workers.persona.session_files import SESSIONS_DIR
from workers.persona.tool_config import PythonDecl
from workers.persona.toolbox import python_tool, refuse_shared_names
from workers.persona.transcript_layout import TRANSCRIPTS_DIR

__all__ = [
    "KNOWN_NAMES",
    "Checkup",
    "check_persona",
    "empty_soul_warning",
    "misnamed_file_warnings",
    "soul_over_budget_warning",
]


@dataclass(frozen=True, slots=True)
class Checkup:
    """A persona that loads: its definition, what deserves a warning, and the soul a turn
    would compose now (with the bootstrap files it found)."""

    agent: AgentDef
    warnings: list[str] = field(default_factory=list)
    soul: str = ""
    found: list[str] = field(default_factory=list)


def soul_over_budget_warning(name: str, size: int, limit: int) -> str:
    return (
        f"persona {name}'s soul alone is about {size} tokens, over the turn budget "
        f"(SOULFLEET_TURN_MAX_TOKENS={limit}): every turn of a new session ends before its "
        "model call (limit max_tokens; a conversation under way keeps the soul it started "
        "with until it resets). Shrink MEMORY.md (or set memory_index_cap in persona.toml) or "
        "raise the budget"
    )


def soul_budget_warning(name: str, soul: str, limit: int) -> str | None:
    """:func:`soul_over_budget_warning` when ``soul`` alone is estimated over ``limit``."""
    size = estimate_tokens((), soul)
    return soul_over_budget_warning(name, size, limit) if size > limit else None


def input_over_budget_remedy(persona: str, *, dreamer: bool = False) -> str:
    """What to do when a turn's input alone is over its token budget (no model call made).
    A dream pass has no history to reset: its soul is DREAM.md and the memory it reads."""
    if dreamer:
        return (
            f"shrink {persona}'s DREAM.md or MEMORY.md (or set memory_index_cap in "
            "persona.toml), or raise SOULFLEET_TURN_MAX_TOKENS"
        )
    return (
        "shrink MEMORY.md (or set memory_index_cap in persona.toml), start a new session if "
        f"the history is what is long (`soulfleet session reset {persona}`), or raise "
        "SOULFLEET_TURN_MAX_TOKENS"
    )


def empty_soul_warning(name: str) -> str:
    return (
        f"persona {name} has none of the bootstrap files ({', '.join(BOOTSTRAP_ORDER)}): it "
        "runs with an empty soul (`soulfleet init DIR` scaffolds them)"
    )


#: The file names a persona directory is read by (case matters: ``soul.md`` is never read).
KNOWN_NAMES: tuple[str, ...] = (*BOOTSTRAP_ORDER, "HEARTBEAT.md", MANIFEST_NAME, DREAM_FILE)


def misnamed_file_warnings(agent: AgentDef) -> list[str]:
    """Warnings for files a person meant as persona files but named otherwise (``soul.md``,
    ``heartbeat.md``: a heartbeat then skips every beat, as with no HEARTBEAT.md): nothing
    reads them, and nothing else would say so. On a case-insensitive filesystem such a name is
    read, and is no warning."""
    try:
        present = sorted(os.listdir(agent.home))
    except OSError:
        return []
    known = {name.lower(): name for name in KNOWN_NAMES}
    return [
        f"persona {agent.name}: {name} is not read, names are case-sensitive: rename it to "
        f"{known[name.lower()]}"
        for name in present
        if name.lower() in known
        and name != known[name.lower()]
        and not os.path.exists(os.path.join(agent.home, known[name.lower()]))
    ]


def _python_tools(agent: AgentDef) -> tuple[list[tuple[str, str]], ToolSetupSlow | None]:
    """``(key, tool name)`` of each Python tool the persona declares (each imported: a bad ref
    raises), and the first whose import or factory was still running at its time limit."""
    python: list[tuple[str, str]] = []
    slow: ToolSetupSlow | None = None
    for decl in agent.declared.entries:
        if isinstance(decl, PythonDecl):
            try:
                python.append((decl.key, python_tool(decl, agent.declared.source).name))
            except ToolSetupSlow as exc:
                slow = slow or exc
    return python, slow


def check_persona(
    path: str | os.PathLike[str],
    config: ModelConfig | None = None,
    *,
    model: str | None = None,
    turn_max_tokens: int | None = None,
    mcp_servers: Mapping[str, FleetServer] | None = None,
    calls_model: bool = False,
) -> Checkup:
    """Load ``path`` as a turn would; raise what a turn would fail with, else list warnings.

    ``model`` is a spec chosen over the persona's own (``run --local --model``).
    ``turn_max_tokens`` (SOULFLEET_TURN_MAX_TOKENS) adds a warning when the soul alone is
    estimated over it: every turn of the persona then ends before its model call.
    ``mcp_servers`` (the fleet's MCP config, SOULFLEET_MCP_CONFIG) checks that each ``use`` of
    persona.toml names one of its servers; None skips that check (no fleet in view).
    ``calls_model``: this process calls the model itself (``run --local``), so a model whose
    API key is not set here is a :class:`ModelSpecError`, not a warning about the workers.
    """
    agent = from_dir(path)
    soul, found = agent.soul()
    # Where a turn keeps its conversation: a symlink leading out of the persona (refused by
    # every turn, the lane dead-lettered) was accepted here, and status called it fixed.
    for kept in (TRANSCRIPTS_DIR, SESSIONS_DIR):
        for lane in (agent.name, f"{agent.name}-dreamer"):
            confined(agent.home, f"{kept}/{lane}")
    # What building the turn's tools would refuse, short of starting MCP servers: a Python
    # tool's ref (imported; only a Tool or a marked factory is accepted) and a ``use`` of a
    # server the fleet file lacks. A post to a persona with either was accepted here and
    # dead-lettered its lane at the turn.
    if mcp_servers is not None:
        check_uses(agent.declared, mcp_servers)
    source = agent.declared.source
    python, slow = _python_tools(agent)  # slow: transient, raised last once the rest is checked
    # Two Python tools (or one and `memory`) giving one name: the turn's toolbox refuses it,
    # so the door does. A name shared with an MCP tool only a started server can show.
    refuse_shared_names(python, ("memory",) if agent.memory else (), source)
    resolved = resolve_model(model or agent.model, config or ModelConfig(), base_dir=agent.home)
    warnings = [] if found else [empty_soul_warning(agent.name)]
    warnings.extend(misnamed_file_warnings(agent))
    if turn_max_tokens is not None and (
        over := soul_budget_warning(agent.name, soul, turn_max_tokens)
    ):
        warnings.append(over)
    if (size := estimate_tokens((), soul)) > agent.session.max_tokens:
        warnings.append(
            f"persona {agent.name}'s soul alone is about {size} tokens, over its "
            f"session.max_tokens ({agent.session.max_tokens}): no conversation can go on (every "
            "turn starts a new session and remembers nothing said before); raise [session] "
            "max_tokens in its persona.toml, or shrink the soul"
        )
    missing = resolved.missing_key if isinstance(resolved, HTTPModel) else None
    if missing is not None and calls_model and model is not None:
        raise ModelSpecError(
            f"the model given with --model, {resolved.spec!r}, needs {missing}, which is not "
            "set: this command calls the model itself; set it, or choose another --model"
        )
    if missing is not None and calls_model:
        raise ModelSpecError(
            f"persona {agent.name}'s model {resolved.spec!r} needs {missing}, which is not set: "
            "this command calls the model itself; set it, or leave the turn to the fleet's "
            "workers (without --local)"
        )
    if missing is not None and model is None and inherits(agent.model):
        # The model is this shell's SOULFLEET_MODEL, which says nothing of the workers'.
        warnings.append(
            f"persona {agent.name} names no model in its persona.toml; this shell's "
            f"SOULFLEET_MODEL ({resolved.spec!r}) needs {missing}, which is not set here. The "
            "workers use their own SOULFLEET_MODEL: if it is this one, they must have the key, "
            "or every turn fails"
        )
    elif missing is not None:
        # A warning, not an error: the workers may well have the key this shell lacks.
        warnings.append(
            f"persona {agent.name}'s model {resolved.spec!r} needs {missing}, which is not set "
            "here: the workers that run its turns must have it, or every turn fails"
        )
    if slow is not None:
        raise slow
    return Checkup(agent, warnings, soul, found)

"""persona.toml: the optional file that carries a persona's defaults and schedules.

The directory is the agent, so its settings live next to its soul, in a file a person edits
with any editor. That makes the parser a user interface: every unknown key and every bad value
is a :class:`PersonaConfigError` naming the dotted key (``heartbeat.active_hours.start``) and
the file, because a silently ignored typo (``evrey = "30m"``) is a persona that never beats.
An absent file means all defaults.

The schema (README "persona.toml" documents it for people)::

    does = "routing description"
    model = "inherit"            # or openai:<m> | anthropic:<m> | scripted:<path>
    memory = true
    notes = false
    memory_index_cap = false     # true, or { max_lines = 200, max_bytes = 25600 }
    [heartbeat]
    every = "30m"
    active_hours = { start = "08:00", end = "22:00", timezone = "Europe/Berlin" }
    model = "openai:<small model>"   # heartbeat turns; default SOULFLEET_HEARTBEAT_MODEL, model
    idle_after = "3d"            # no inbound post for this long ...
    idle_every = "6h"            # ... and the heartbeat stretches to this until the next post
    [dream]
    every = "24h"                # or cron = "0 3 * * *"
    timezone = "UTC"
    window = "1h"
    instructions = "..."
    model = "anthropic:<m>"      # dream passes; default SOULFLEET_DREAM_MODEL, then model
    [budget]
    daily_tokens = 200000        # input + output tokens per day (default SOULFLEET_DAILY_TOKENS)
    on_exceed = "skip_background"   # or "stop": refuse every turn
    timezone = "UTC"             # the day the budget counts in
    [[tools.mcp]] / [[tools.python]]   # see workers.persona.tool_config
    [session]
    idle_reset = "4h"            # "0s": every turn is its own session
    daily_reset = "04:00"        # optional
    timezone = "UTC"             # for daily_reset
    max_tokens = 60000           # compact above this estimate
    keep_tail = 30000            # default max_tokens / 2
    flush_to_memory = false

Cron strings are parsed here by the one cron parser (:mod:`workers.persona.cron`, which beat
uses too), so an expression that can never fire fails here, naming ``dream.cron``, for every
reader: ``run --local``, the CLI, the worker and beat. The values a schedule is
made of (durations, time zones, ``ActiveHours`` and the two schedules) live in
:mod:`workers.persona.schedules`; they are re-exported here because this is where people first
look for them.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from workers.persona.cron import CronError, parse_cron
from workers.persona.errors import PersonaConfigError, PersonaFileError, PersonaNotFound
from workers.persona.files import read_inside
from workers.persona.home import DEFAULT_INDEX_CAP
from workers.persona.models.config import spec_problem
from workers.persona.schedules import (
    ActiveHours,
    DreamSchedule,
    HeartbeatSchedule,
    parse_duration,
    valid_timezone,
)
from workers.persona.session import (
    DEFAULT_IDLE_RESET,
    DEFAULT_MAX_TOKENS,
    SessionConfig,
)
from workers.persona.spend import ON_EXCEED, DailyBudget
from workers.persona.toml_table import TomlTable
from workers.persona.tool_config import ToolsConfig, parse_tools

__all__ = [
    "MANIFEST_MAX_BYTES",
    "MANIFEST_NAME",
    "ActiveHours",
    "DreamSchedule",
    "HeartbeatSchedule",
    "PersonaConfig",
    "SessionConfig",
    "holds_persona",
    "load_manifest",
    "parse_duration",
    "parse_manifest",
    "valid_timezone",
]

MANIFEST_NAME = "persona.toml"
#: A persona.toml is a few lines; anything past this is a mistake, refused before it is parsed.
MANIFEST_MAX_BYTES = 256 * 1024


def holds_persona(directory: Path) -> bool:
    """Whether ``directory`` is a persona home by its files (it holds persona.toml or
    SOUL.md): what may not be a personas root, nor hold another persona."""
    return any((directory / name).is_file() for name in (MANIFEST_NAME, "SOUL.md"))


# A spec is "inherit" or "<provider>:<rest>"; which providers exist is models/spec.py's call.
_MODEL_SPEC = re.compile(r"[a-z][a-z0-9_-]*:\S.*", re.DOTALL)


def _error(key: str | None, problem: str, source: object = None) -> PersonaConfigError:
    return PersonaConfigError(source, key, problem)


@dataclass(frozen=True)
class PersonaConfig:
    """Everything persona.toml can say; the defaults are what an absent file means."""

    does: str = ""
    model: str = "inherit"
    memory: bool = True
    notes: bool = False
    memory_index_cap: tuple[int, int] | None = None
    heartbeat: HeartbeatSchedule | None = None
    dream: DreamSchedule | None = None
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    budget: DailyBudget | None = None


def _active_hours(table: TomlTable) -> ActiveHours:
    table.check_keys(("start", "end", "timezone"))
    return ActiveHours(
        start=table.clock_time("start", allow_24=False),
        end=table.clock_time("end", allow_24=True),
        timezone=table.timezone("timezone"),
    )


def _heartbeat(table: TomlTable, home: Path | None) -> HeartbeatSchedule:
    table.check_keys(("every", "active_hours", "model", "idle_after", "idle_every"))
    every = table.duration("every")
    if every is None:
        raise table.fail("every", 'is required in [heartbeat] (e.g. every = "30m")')
    hours = table.table("active_hours")
    active_hours = None if hours is None else _active_hours(hours)
    idle_after, idle_every = table.duration("idle_after"), table.duration("idle_every")
    if (idle_after is None) != (idle_every is None):
        missing = "idle_every" if idle_every is None else "idle_after"
        raise table.fail(missing, "is required with the other idle key (idle_after, idle_every)")
    if idle_every is not None and idle_every < every:
        raise table.fail("idle_every", "must not be shorter than heartbeat.every")
    return HeartbeatSchedule(
        every=every,
        active_hours=active_hours,
        model=_kind_model(table, home),
        idle_after=idle_after,
        idle_every=idle_every,
    )


def _cron(table: TomlTable) -> str | None:
    value = table.data.get("cron")
    if value is None:
        return None
    fields = value.split() if isinstance(value, str) else []
    if len(fields) != 5:
        raise table.fail(
            "cron",
            f'must be a cron expression of 5 whitespace-separated fields such as "0 3 * * *", '
            f"got {value!r}",
        )
    expression = " ".join(fields)
    try:
        parse_cron(expression)
    except CronError as exc:
        problem = f"is not a valid cron expression: {exc.problem} (got {value!r})"
        raise table.fail("cron", problem) from None
    return expression


def _dream(table: TomlTable, home: Path | None) -> DreamSchedule:
    table.check_keys(("every", "cron", "timezone", "window", "instructions", "model"))
    every = table.duration("every")
    cron = _cron(table)
    if every is not None and cron is not None:
        raise table.fail("cron", "cannot be combined with dream.every: choose one schedule")
    if every is None and cron is None:
        raise table.fail("every", 'is missing: [dream] needs every = "24h" or cron = "0 3 * * *"')
    return DreamSchedule(
        every=every,
        cron=cron,
        timezone=table.timezone("timezone"),
        window=table.duration("window"),
        instructions=table.string("instructions"),
        model=_kind_model(table, home),
    )


def _kind_model(table: TomlTable, home: Path | None) -> str | None:
    """``heartbeat.model`` / ``dream.model``; "inherit" there means "not set": fall back to the
    fleet's per-kind default, then the persona's model."""
    value = _model_key(table, "model", home)
    return None if value == "inherit" else value


def _budget(table: TomlTable) -> DailyBudget:
    table.check_keys(("daily_tokens", "on_exceed", "timezone"))
    on_exceed = table.string("on_exceed", "skip_background")
    if on_exceed not in ON_EXCEED:
        choices = " or ".join(f'"{choice}"' for choice in ON_EXCEED)
        raise table.fail("on_exceed", f"must be {choices}, got {on_exceed!r}")
    return DailyBudget(
        daily_tokens=table.natural("daily_tokens") if "daily_tokens" in table.data else None,
        on_exceed=on_exceed,
        timezone=table.timezone("timezone"),
    )


def _session(table: TomlTable) -> SessionConfig:
    table.check_keys(
        ("idle_reset", "daily_reset", "timezone", "max_tokens", "keep_tail", "flush_to_memory")
    )
    idle = table.duration("idle_reset", zero="every turn is its own session")
    daily = (
        None if "daily_reset" not in table.data else table.clock_time("daily_reset", allow_24=False)
    )
    max_tokens = table.positive_int("max_tokens", DEFAULT_MAX_TOKENS)
    keep_tail = None
    if "keep_tail" in table.data:
        keep_tail = table.positive_int("keep_tail", 1)
        if keep_tail >= max_tokens:
            raise table.fail(
                "keep_tail",
                f"must be less than session.max_tokens ({max_tokens}), got {keep_tail}: the tail "
                "kept verbatim has to leave something to summarize",
            )
    return SessionConfig(
        idle_reset=DEFAULT_IDLE_RESET if idle is None else idle,
        daily_reset=daily,
        timezone=table.timezone("timezone"),
        max_tokens=max_tokens,
        keep_tail=keep_tail,
        flush_to_memory=table.boolean("flush_to_memory", False),
    )


def _index_cap(root: TomlTable) -> tuple[int, int] | None:
    value = root.data.get("memory_index_cap", False)
    if isinstance(value, bool):
        return DEFAULT_INDEX_CAP if value else None
    if not isinstance(value, dict):
        raise root.fail(
            "memory_index_cap",
            f"must be true, false or a table {{ max_lines = N, max_bytes = N }}, got {value!r}",
        )
    table = TomlTable(value, "memory_index_cap", root.source)
    table.check_keys(("max_lines", "max_bytes"))
    return (
        table.positive_int("max_lines", DEFAULT_INDEX_CAP[0]),
        table.positive_int("max_bytes", DEFAULT_INDEX_CAP[1]),
    )


def _model(root: TomlTable, home: Path | None) -> str:
    value = _model_key(root, "model", home)
    return "inherit" if value is None else value


def _model_key(table: TomlTable, name: str, home: Path | None) -> str | None:
    value = table.string(name)
    if value is None:
        return None
    if value != "inherit" and _MODEL_SPEC.fullmatch(value) is None:
        raise table.fail(
            name,
            f'must be "inherit" or a spec such as "openai:<model>", "anthropic:<model>" or '
            f'"scripted:<path>", got {value!r}',
        )
    # A provider no client exists for (``openai-typo:``) fails here, as SOULFLEET_MODEL does
    # at process start: beat reports the persona invalid and `soul` refuses it, instead of a
    # lane dead-lettered by its first turn.
    if (problem := spec_problem(value)) is not None:
        raise table.fail(name, problem)
    # A scripted path in persona.toml is relative to the persona directory, not to whatever
    # directory the worker happens to run in.
    if home is not None and value.startswith("scripted:"):
        rest = value.removeprefix("scripted:").strip()
        path = Path(rest)
        # "scripted:builtin" names the built-in script, not a file called builtin.
        if rest != "builtin" and not path.is_absolute():
            value = f"scripted:{home / path}"
    return value


def parse_manifest(text: str, *, home: Path | None = None, source: object = None) -> PersonaConfig:
    """Parse persona.toml text. ``home`` anchors relative ``scripted:`` paths; ``source`` names
    the file in errors."""
    try:
        # A byte-order mark (Windows editors save one) is not TOML, and is invisible in every
        # editor: "Invalid statement at line 1, column 1" for it sent people hunting a typo.
        data = tomllib.loads(text.removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as exc:
        raise _error(None, f"is not valid TOML: {exc}", source) from exc
    except RecursionError:  # arrays or tables nested past Python's recursion limit
        raise _error(None, "is nested too deeply to read", source) from None
    root = TomlTable(data, "", source)
    known = ("does", "model", "memory", "notes", "memory_index_cap", "heartbeat", "dream")
    root.check_keys((*known, "budget", "tools", "session"))
    heartbeat = root.table("heartbeat")
    dream = root.table("dream")
    budget = root.table("budget")
    session = root.table("session")
    return PersonaConfig(
        does=root.string("does", "") or "",
        model=_model(root, home),
        memory=root.boolean("memory", True),
        notes=root.boolean("notes", False),
        memory_index_cap=_index_cap(root),
        heartbeat=None if heartbeat is None else _heartbeat(heartbeat, home),
        dream=None if dream is None else _dream(dream, home),
        budget=None if budget is None else _budget(budget),
        tools=parse_tools(data.get("tools"), text=text, source=source),
        session=SessionConfig() if session is None else _session(session),
    )


def load_manifest(home: str | Path) -> PersonaConfig:
    """Read ``<home>/persona.toml``; an absent file means :class:`PersonaConfig` defaults.

    Raises PersonaNotFound when ``home`` is not a directory, PersonaFileError when the manifest
    cannot be read as a file, and PersonaConfigError (naming the key and the file) when it is
    invalid.
    """
    home = Path(home)
    if not home.is_dir():
        raise PersonaNotFound(home)
    path = home / MANIFEST_NAME
    # Through the one door: a FIFO or /dev/zero named persona.toml is refused, never read.
    raw = read_inside(home, MANIFEST_NAME, MANIFEST_MAX_BYTES)
    if raw is None:
        return PersonaConfig()
    if len(raw) > MANIFEST_MAX_BYTES:
        raise PersonaFileError(
            path, f"is larger than {MANIFEST_MAX_BYTES} bytes, the most a persona.toml may hold"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(None, f"is not valid UTF-8 (byte {exc.start})", path) from exc
    return parse_manifest(text, home=home, source=path)

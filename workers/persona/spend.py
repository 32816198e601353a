"""Spend: the rules that decide which model a turn pays for, and whether it pays at all.

Pure values and functions (no Redis, no Celery), shared by beat's sweep, the turn executor
and the CLI, so "would this call be skipped, and why" has one answer everywhere:

- :func:`model_for_kind`: a heartbeat goes to ``heartbeat.model``, a dream to ``dream.model``,
  a conversation to ``model``; each falls back to the fleet's per-kind default and then to the
  persona's own model, so a fleet can put every heartbeat on a cheap model with one variable.
- :func:`heartbeat_blank`: a HEARTBEAT.md that holds only white space, HTML comments,
  headings or empty list items asks for nothing, so its beat is skipped (``blank_heartbeat``)
  instead of paying a model to answer ``HEARTBEAT_OK``.
- :class:`DailyBudget` and :func:`usage_day`: a persona's daily token budget and the day its
  usage is counted in (its budget time zone, UTC unless it says otherwise).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal
from zoneinfo import ZoneInfo

from workers.persona.errors import PersonaError
from workers.persona.files import read_inside
from workers.persona.heartbeat import without_comments
from workers.persona.home import MAX_FILE_BYTES
from workers.persona.summary_cache import SUMMARY_NAME

__all__ = [
    "BACKGROUND_KINDS",
    "DREAM_SOURCES",
    "HEARD",
    "HEARTBEAT_FILE",
    "ON_EXCEED",
    "WRITTEN",
    "DailyBudget",
    "HeartbeatSkip",
    "OnExceed",
    "TurnKind",
    "budget_refuses",
    "effective_budget",
    "heartbeat_blank",
    "heartbeat_file_skip",
    "model_for_kind",
    "newest_write",
    "nothing_new",
    "pass_field",
    "pass_times",
    "usage_day",
]

TurnKind = Literal["interactive", "heartbeat", "dream"]
HEARTBEAT_FILE = "HEARTBEAT.md"
OnExceed = Literal["skip_background", "stop"]
ON_EXCEED: tuple[OnExceed, ...] = ("skip_background", "stop")
#: Turns nobody is waiting for: the ones a budget skips first.
BACKGROUND_KINDS = frozenset({"heartbeat", "dream"})

_HEADING = re.compile(r"#{1,6}(?:\s.*)?")
_SETEXT = re.compile(r"=+|-+")
_EMPTY_ITEM = re.compile(r"(?:[-*+]|\d+[.)])(?:\s+\[[ xX]?\])?")
_LIST_ITEM = re.compile(r"(?:[-*+]|\d+[.)])\s")


HeartbeatSkip = Literal["no_heartbeat_file", "blank_heartbeat", "invalid_heartbeat_file"]


def heartbeat_file_skip(home: str | os.PathLike[str]) -> HeartbeatSkip | None:
    """Why every beat of the persona at ``home`` is skipped for its HEARTBEAT.md, as the fleet's
    beat and the in-process driver skip it: there is none, it asks for nothing
    (:func:`heartbeat_blank`), or something other than a readable file sits at its name; None
    when it asks for something."""
    try:
        raw = read_inside(home, HEARTBEAT_FILE, MAX_FILE_BYTES)
    except PersonaError:
        return "invalid_heartbeat_file"
    if raw is None:
        return "no_heartbeat_file"
    return "blank_heartbeat" if heartbeat_blank(raw.decode("utf-8", "replace")) else None


def heartbeat_blank(text: str) -> bool:
    """True when ``text`` asks for nothing: only white space, HTML comments (an unclosed one
    runs to the end), headings (``#`` lines, setext underlines) or empty list items
    (``-``, ``*``, ``1.``, ``- [ ]``)."""
    lines = [line.strip() for line in without_comments(text).splitlines()]
    for index, line in enumerate(lines):
        if not line:
            continue
        if _HEADING.fullmatch(line) or _SETEXT.fullmatch(line) or _EMPTY_ITEM.fullmatch(line):
            continue
        underline = lines[index + 1] if index + 1 < len(lines) else ""
        if underline and _SETEXT.fullmatch(underline) and not _LIST_ITEM.match(line):
            continue  # a setext heading's title line (after a list item, "---" is a rule)
        return False
    return True


def model_for_kind(
    kind: str,
    *,
    persona_model: str,
    heartbeat_model: str | None,
    dream_model: str | None,
    fleet_heartbeat_model: str = "",
    fleet_dream_model: str = "",
) -> str:
    """The model spec a turn of ``kind`` uses.

    ``dream`` -> dream.model, else SOULFLEET_DREAM_MODEL, else the persona's model;
    ``heartbeat`` -> heartbeat.model, else SOULFLEET_HEARTBEAT_MODEL, else the persona's model;
    anything else (a conversation) -> the persona's model. The persona's model may itself be
    ``inherit`` (SOULFLEET_MODEL), resolved later by the model spec parser.
    """
    if kind == "dream":
        return dream_model or fleet_dream_model or persona_model
    if kind == "heartbeat":
        return heartbeat_model or fleet_heartbeat_model or persona_model
    return persona_model


@dataclass(frozen=True, slots=True)
class DailyBudget:
    """``[budget]``: at most ``daily_tokens`` (input + output, as the provider reported them)
    per day in ``timezone``; past it, ``skip_background`` skips heartbeats and dreams while
    conversations still run, ``stop`` refuses every turn. Resets at the day boundary."""

    daily_tokens: int | None = None
    on_exceed: OnExceed = "skip_background"
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if self.daily_tokens is not None and self.daily_tokens < 0:
            raise ValueError(f"daily_tokens must be >= 0, got {self.daily_tokens}")
        if self.on_exceed not in ON_EXCEED:
            raise ValueError(f"on_exceed must be one of {ON_EXCEED}, got {self.on_exceed!r}")

    def refuses(self, kind: str, spent: int) -> bool:
        """Whether a turn of ``kind`` may not call the model after ``spent`` tokens today."""
        return budget_refuses(self, kind, spent)

    def day(self, when: float) -> str:
        return usage_day(when, self.timezone)


def budget_refuses(budget: DailyBudget | None, kind: str, spent: int) -> bool:
    """True when ``budget`` is used up and its ``on_exceed`` covers turns of ``kind``."""
    if budget is None or budget.daily_tokens is None or spent < budget.daily_tokens:
        return False
    return budget.on_exceed == "stop" or kind in BACKGROUND_KINDS


def effective_budget(budget: DailyBudget | None, fleet_daily_tokens: int | None) -> DailyBudget:
    """The persona's ``[budget]`` with ``daily_tokens`` defaulted to SOULFLEET_DAILY_TOKENS
    (``daily_tokens`` None: no limit; the time zone still names the persona's usage day)."""
    if budget is None:
        return DailyBudget(daily_tokens=fleet_daily_tokens)
    if budget.daily_tokens is None and fleet_daily_tokens is not None:
        return DailyBudget(fleet_daily_tokens, budget.on_exceed, budget.timezone)
    return budget


def usage_day(when: float, timezone: str = "UTC") -> str:
    """The ``YYYY-MM-DD`` day the instant ``when`` (epoch seconds) falls on in ``timezone``."""
    zone = UTC if timezone == "UTC" else ZoneInfo(timezone)
    return datetime.fromtimestamp(when, zone).strftime("%Y-%m-%d")


#: What a dream pass reads: a write to any of these since the last pass is something new.
#: Paths relative to the persona home; ``{persona}`` is the persona's name. A directory counts
#: the files directly in it. A new source of a persona's experience is one more line here.
#: :data:`HEARD` is what only others write (the persona's conversations): new when written
#: after the pass BEGAN, since the pass could not read what came while it ran. The rest the
#: dreamer writes itself: new only when written after the pass ended.
#: Conversations are read off the persona's session states, not its transcripts: a state file
#: is written by every turn that adds to the conversation, and never by a silent heartbeat,
#: whose lines do go to the transcript (for audit): with the transcripts, a persona with a
#: HEARTBEAT.md had "something new" for every scheduled dream and paid for each.
HEARD: tuple[str, ...] = ("sessions/{persona}",)
WRITTEN: tuple[str, ...] = (
    "memory",  # notes (memory/<slug>.md)
    "MEMORY.md",
    "USER.md",
)
DREAM_SOURCES: tuple[str, ...] = (*HEARD, *WRITTEN)


def pass_field(ended: float, began: float) -> str:
    """The ``last_pass`` field of a pass that ran from ``began`` to ``ended`` (epoch s); read
    back by :func:`pass_times`."""
    return f"{int(ended * 1000)}:{int(began * 1000)}"


def pass_times(raw: object) -> tuple[float, float] | None:
    """``(ended, began)`` (epoch s) of a dreamer lane's ``last_pass`` field, None when unset.

    Stored as ``"<ended ms>:<began ms>"`` (:func:`pass_field`); a bare ``"<ms>"`` (written
    before the start was kept) reads as a pass that began when it ended."""
    if raw is None or raw in (b"", ""):
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    ended, _, began = text.partition(":")
    return int(ended) / 1000, int(began or ended) / 1000


def newest_write(
    home: str | os.PathLike[str], persona: str, sources: tuple[str, ...] = DREAM_SOURCES
) -> float:
    """The newest modification time (epoch seconds) among ``sources``; 0.0: none."""
    newest = 0.0
    for source in sources:
        path = os.path.join(home, source.format(persona=persona))
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            newest = max(newest, st.st_mtime)
            continue
        # A lane's directory also holds its kept summary (SUMMARY.json, written by a turn that
        # may commit nothing, a silent beat): only its session states are something heard.
        heard = source in HEARD
        if not heard:
            newest = max(newest, st.st_mtime)  # a file created or removed in it
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if heard and (entry.name == SUMMARY_NAME or entry.name.startswith(".")):
                        continue
                    with contextlib.suppress(OSError):
                        if entry.is_file(follow_symlinks=False):
                            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
        except OSError:
            continue
    return newest


def nothing_new(
    home: str | os.PathLike[str],
    persona: str,
    last_pass: float | None,
    began: float | None = None,
) -> bool:
    """True when nothing in :data:`DREAM_SOURCES` was written after the last pass (epoch
    seconds: ``last_pass`` when it ended, ``began`` when it began, default the same): a dream
    pass would only re-read what it already folded. A conversation written while the pass ran
    is new (:data:`HEARD`); the pass's own writes are not. A persona that never dreamed (None)
    always has something new: its first pass runs."""
    if last_pass is None:
        return False
    heard_since = last_pass if began is None else min(began, last_pass)
    if newest_write(home, persona, HEARD) > heard_since:
        return False
    return newest_write(home, persona, WRITTEN) <= last_pass

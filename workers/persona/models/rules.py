"""The scripted model's rules file: its format, and its validation into :class:`Rule` values.

Kept apart from the matching (:mod:`workers.persona.models.scripted`) because it is the part a
person writes: every check here exists to turn a typo into an error that names the rule index
and the field (``rules[2] (remember).when.user_regex: invalid regular expression: ...``) at load
time, not a silent miss in the middle of a turn.

Format (TOML or JSON; the README has an example): a top-level ``rules`` list; each rule has an
optional ``name``, an optional ``when`` table of conditions, ``text`` and/or ``calls`` (a list
of ``{tool, args}``), and an optional ``sleep`` in seconds. Strings in ``text`` and ``args`` may
use the :data:`PLACEHOLDERS`; ``{{`` and ``}}`` are literal braces.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.persona.errors import ModelSpecError, PersonaFileError
from workers.persona.files import read_prefix

__all__ = [
    "PLACEHOLDER",
    "PLACEHOLDERS",
    "CallTemplate",
    "Rule",
    "decode",
    "load_rules",
    "parse_rules",
]

PLACEHOLDERS: Mapping[str, str] = {
    "sections": 'comma-separated names of the "## <file>" sections in the system prompt',
    "section": "the body of the rule's `section` (empty when it has none)",
    "user": "the last user message",
    "user_short": "its first line, cut to 80 characters",
    "match": "first capture group of the rule's regex (the whole match if it has no groups)",
    "match0": "the whole match of the rule's regex; match1 … match9: capture groups",
    "tool_result": "the text of the first tool result since the last user message",
    "last_tool_result": "the text of the latest tool result",
    "tool_results": "how many tool results there are since the last user message",
}

#: A rules file is read whole through the bounded reader; this is far past any real script.
MAX_RULES_BYTES = 4 * 1024 * 1024

_WHEN_KEYS = frozenset(
    {
        "system_contains",
        "system_regex",
        "section",
        "section_contains",
        "section_regex",
        "user_contains",
        "user_regex",
        "heartbeat",
        "tool_results",
        "tool",
        "tool_error",
    }
)
_RULE_KEYS = frozenset({"name", "when", "text", "calls", "sleep"})
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([a-z_]+[0-9]?)\}")
_MATCH_N = re.compile(r"match[0-9]")


@dataclass(frozen=True, slots=True)
class CallTemplate:
    """One tool call a rule makes: the tool's name and its (unsubstituted) arguments."""

    tool: str
    args: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Rule:
    """One validated rule. Unset conditions are ``None`` and always hold."""

    index: int
    name: str
    system_contains: str | None = None
    system_regex: re.Pattern[str] | None = None
    section: str | None = None
    section_contains: str | None = None
    section_regex: re.Pattern[str] | None = None
    user_contains: str | None = None
    user_regex: re.Pattern[str] | None = None
    heartbeat: bool | None = None
    tool_results: int | None = None
    tool: str | None = None
    tool_error: bool | None = None
    text: str | None = None
    calls: tuple[CallTemplate, ...] = ()
    sleep: float = 0.0


class _RuleError(Exception):
    """A rule-file problem at one field; turned into a ModelSpecError naming the source."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _RuleError(where, f"must be a string, got {type(value).__name__}")
    return value


def _regex(value: object, where: str) -> re.Pattern[str]:
    try:
        return re.compile(_string(value, where))
    except re.error as exc:
        raise _RuleError(where, f"invalid regular expression: {exc}") from None


def _check_placeholders(value: object, where: str) -> None:
    if isinstance(value, str):
        for found in PLACEHOLDER.finditer(value):
            name = found.group(1)
            if name is not None and name not in PLACEHOLDERS and not _MATCH_N.fullmatch(name):
                known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                raise _RuleError(
                    where,
                    f"unknown placeholder {{{name}}} (known: {known}, match1..match9; "
                    "write {{ and }} for literal braces)",
                )
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_placeholders(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_placeholders(item, f"{where}[{i}]")


def _parse_when(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _RuleError(where, "must be a table")
    unknown = sorted(set(raw) - _WHEN_KEYS)
    if unknown:
        known = ", ".join(sorted(_WHEN_KEYS))
        raise _RuleError(f"{where}.{unknown[0]}", f"unknown condition (known: {known})")
    parsed: dict[str, Any] = {}
    for key, value in raw.items():
        at = f"{where}.{key}"
        if key.endswith("_regex"):
            parsed[key] = _regex(value, at)
        elif key in ("heartbeat", "tool_error"):
            if not isinstance(value, bool):
                raise _RuleError(at, "must be true or false")
            parsed[key] = value
        elif key == "tool_results":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _RuleError(at, "must be a whole number >= 0")
            parsed[key] = value
        else:
            parsed[key] = _string(value, at)
            if key in ("section", "tool") and not value:
                raise _RuleError(at, "must not be empty")
    has_section_test = "section_contains" in parsed or "section_regex" in parsed
    if has_section_test and "section" not in parsed:
        raise _RuleError(f"{where}.section", "is required with section_contains / section_regex")
    return parsed


def _parse_calls(raw: object, where: str) -> tuple[CallTemplate, ...]:
    if not isinstance(raw, list):
        raise _RuleError(where, "must be a list of {tool, args} tables")
    calls = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise _RuleError(at, "must be a table with `tool` and optional `args`")
        unknown = sorted(set(item) - {"tool", "args"})
        if unknown:
            raise _RuleError(f"{at}.{unknown[0]}", "unknown key (known: tool, args)")
        tool = _string(item.get("tool"), f"{at}.tool")
        if not tool:
            raise _RuleError(f"{at}.tool", "must not be empty")
        args = item.get("args", {})
        if not isinstance(args, Mapping):
            raise _RuleError(f"{at}.args", "must be a table")
        _check_placeholders(dict(args), f"{at}.args")
        calls.append(CallTemplate(tool=tool, args=dict(args)))
    return tuple(calls)


def _parse_rule(index: int, raw: object) -> Rule:
    where = f"rules[{index}]"
    if not isinstance(raw, Mapping):
        raise _RuleError(where, "must be a table")
    name = raw.get("name", f"#{index}")
    if isinstance(name, str) and name != f"#{index}":
        where = f"rules[{index}] ({name})"
    unknown = sorted(set(raw) - _RULE_KEYS)
    if unknown:
        known = ", ".join(sorted(_RULE_KEYS))
        raise _RuleError(f"{where}.{unknown[0]}", f"unknown key (known: {known})")
    when = _parse_when(raw.get("when", {}), f"{where}.when")
    text = raw.get("text")
    if text is not None:
        _check_placeholders(_string(text, f"{where}.text"), f"{where}.text")
    calls = _parse_calls(raw.get("calls", []), f"{where}.calls")
    if text is None and not calls:
        raise _RuleError(f"{where}.text", "a rule needs `text` and/or `calls`")
    sleep = raw.get("sleep", 0.0)
    if isinstance(sleep, bool) or not isinstance(sleep, int | float) or sleep < 0:
        raise _RuleError(f"{where}.sleep", "must be a number of seconds >= 0")
    return Rule(
        index=index,
        name=_string(name, f"{where}.name"),
        text=text,
        calls=calls,
        sleep=float(sleep),
        **when,
    )


def _parse_rules(data: object) -> tuple[Rule, ...]:
    if not isinstance(data, Mapping):
        raise _RuleError("top level", "must be a table with a `rules` list")
    unknown = sorted(set(data) - {"rules"})
    if unknown:
        raise _RuleError(unknown[0], "unknown top-level key (the file holds only `rules`)")
    rules = data.get("rules")
    if not isinstance(rules, list):
        raise _RuleError("rules", "is required: a list of rule tables ([[rules]] in TOML)")
    return tuple(_parse_rule(i, raw) for i, raw in enumerate(rules))


def parse_rules(data: object, *, source: str = "<inline>") -> tuple[Rule, ...]:
    """Validate already-decoded data (``{"rules": [...]}``); ModelSpecError names the field."""
    try:
        return _parse_rules(data)
    except _RuleError as exc:
        raise ModelSpecError(f"scripted rules {source}: {exc}") from None


def load_rules(path: str | Path) -> tuple[Rule, ...]:
    """Read and validate a ``.toml`` or ``.json`` rules file; any problem is a ModelSpecError."""
    file = Path(path)
    try:
        data = read_prefix(file, MAX_RULES_BYTES)
        if data is None:
            raise ModelSpecError(f"scripted rules file not found: {file}")
        if len(data) > MAX_RULES_BYTES:
            raise ModelSpecError(f"scripted rules file {file} is over {MAX_RULES_BYTES} bytes")
        raw = data.decode("utf-8")
    except PersonaFileError as exc:
        raise ModelSpecError(f"scripted rules file {exc}") from None
    except UnicodeDecodeError as exc:
        raise ModelSpecError(f"scripted rules file {file} unreadable: {exc}") from None
    return parse_rules(decode(raw, file.suffix.lower(), str(file)), source=str(file))


def decode(raw: str, suffix: str, source: str) -> Any:
    """Decode rules text by file suffix (.toml or .json); a leading byte-order mark is
    dropped (neither format takes one, and no editor shows it)."""
    raw = raw.removeprefix("\ufeff")
    if suffix == ".toml":
        try:
            return tomllib.loads(raw)
        except tomllib.TOMLDecodeError as exc:
            raise ModelSpecError(f"scripted rules {source}: not valid TOML: {exc}") from None
        except RecursionError:
            raise ModelSpecError(f"scripted rules {source}: nested too deeply to read") from None
    if suffix == ".json":
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ModelSpecError(f"scripted rules {source}: not valid JSON: {exc}") from None
        except RecursionError:
            raise ModelSpecError(f"scripted rules {source}: nested too deeply to read") from None
    raise ModelSpecError(f"scripted rules {source}: the file must end in .toml or .json")

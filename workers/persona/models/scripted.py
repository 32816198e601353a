"""The scripted model: a deterministic, offline :class:`~workers.persona.models.Model`.

It answers from an ordered list of rules read from a TOML or JSON file; the first rule whose
conditions all hold wins. It exists so that everything around a model — the loop, memory,
heartbeats, transcripts, the fleet — can be run and tested end to end with no network and no
bill, and so a fleet with no model configured still does something sensible (the built-in
script, ``default_script.toml``, which answers plainly and keeps heartbeats silent unless
HEARTBEAT.md says something is due).

Why rules and not a Python callback: a rules file is data, so it can live in a persona's home
next to its bootstrap files, be named in a spec string (``scripted:<path>``), and be written by
someone who does not write Python. Every rule is validated when the file is loaded, and an
error names the rule index and the field, so a typo fails at start-up, not in the middle of a
turn.

A rule matches on (all given conditions must hold):

- the system prompt (``system_contains`` / ``system_regex``),
- the body of one ``## <file>`` section of the system prompt (``section`` plus
  ``section_contains`` / ``section_regex``),
- the last user message (``user_contains`` / ``user_regex``),
- whether that message is a heartbeat wake (``heartbeat``: it contains ``HEARTBEAT_PROMPT``),
- the number of tool results since the last user message (``tool_results``),
- whether a tool is offered (``tool``) and whether the latest tool result is an error
  (``tool_error``).

It answers with ``text`` and/or ``calls`` (``{tool, args}``), with ``{placeholder}``
substitution in every answer string (recursively inside ``args``). The file format and its
validation live in :mod:`workers.persona.models.rules`.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import TurnTimeUp
from workers.persona.heartbeat import HEARTBEAT_PROMPT, without_comments
from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.models.rules import (
    PLACEHOLDER,
    PLACEHOLDERS,
    Rule,
    decode,
    load_rules,
    parse_rules,
)
from workers.persona.turn_time import bounded_timeout

__all__ = [
    "BUILTIN_SPEC",
    "FALLBACK_TEXT",
    "PLACEHOLDERS",
    "Rule",
    "ScriptedModel",
    "sections_of",
]

FALLBACK_TEXT = "(scripted model: no rule matched this turn)"
BUILTIN_SPEC = "scripted:builtin"

_SECTION_HEADER = re.compile(r"^## ([A-Za-z0-9][A-Za-z0-9_.-]*\.md)[ \t]*$", re.MULTILINE)
_SHORT = 80


def sections_of(system: str) -> dict[str, str]:
    """The ``## <file>`` sections of a composed soul, name -> trimmed body, in prompt order.

    Only headers naming a ``.md`` file count, so a ``## Goals`` heading inside a body does not
    split it.
    """
    headers = list(_SECTION_HEADER.finditer(system))
    found: dict[str, str] = {}
    for i, header in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(system)
        found.setdefault(header.group(1), system[header.end() : end].strip())
    return found


@dataclass(frozen=True, slots=True)
class _Turn:
    """What the rules look at, computed once per ``complete`` call."""

    system: str
    sections: dict[str, str]
    user: str
    results: tuple[Message, ...]
    tools: frozenset[str]


def _turn_of(system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> _Turn:
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    user = messages[last_user].content if last_user >= 0 else ""
    results = tuple(m for m in messages[last_user + 1 :] if m.role == "tool")
    return _Turn(system, sections_of(system), user, results, frozenset(t.name for t in tools))


def _matches(rule: Rule, turn: _Turn) -> dict[str, str] | None:
    """The rule's substitution values if it matches this turn, else None."""
    if not _state_holds(rule, turn):
        return None
    # Regex matches in rising precedence for {match}: system, then section, then user (the
    # most specific input wins).
    found: list[re.Match[str]] = []
    if not _text_holds(rule.system_contains, rule.system_regex, turn.system, found):
        return None
    body = ""
    if rule.section is not None:
        section = turn.sections.get(rule.section)
        if section is None:
            return None
        body = without_comments(section)
        if not _text_holds(rule.section_contains, rule.section_regex, body, found):
            return None
    if not _text_holds(rule.user_contains, rule.user_regex, turn.user, found):
        return None
    return _values(turn, body, found[-1] if found else None)


def _state_holds(rule: Rule, turn: _Turn) -> bool:
    return (
        (rule.heartbeat is None or (HEARTBEAT_PROMPT in turn.user) == rule.heartbeat)
        and (rule.tool_results is None or len(turn.results) == rule.tool_results)
        and (rule.tool is None or rule.tool in turn.tools)
        and (
            rule.tool_error is None
            or (bool(turn.results) and turn.results[-1].is_error == rule.tool_error)
        )
    )


def _text_holds(
    contains: str | None,
    regex: re.Pattern[str] | None,
    text: str,
    found: list[re.Match[str]],
) -> bool:
    if contains is not None and contains not in text:
        return False
    if regex is not None:
        match = regex.search(text)
        if match is None:
            return False
        found.append(match)
    return True


def _values(turn: _Turn, body: str, found: re.Match[str] | None) -> dict[str, str]:
    first_line = turn.user.strip().split("\n", 1)[0]
    values = {
        "sections": ", ".join(turn.sections),
        "section": body,
        "user": turn.user,
        "user_short": first_line if len(first_line) <= _SHORT else first_line[:_SHORT] + "…",
        "tool_result": turn.results[0].content if turn.results else "",
        "last_tool_result": turn.results[-1].content if turn.results else "",
        "tool_results": str(len(turn.results)),
    }
    groups = (found.group(0), *found.groups()) if found is not None else ("",)
    for n in range(10):
        values[f"match{n}"] = (groups[n] if n < len(groups) else "") or ""
    values["match"] = values["match1"] if len(groups) > 1 else values["match0"]
    return values


def _substitute(value: Any, values: Mapping[str, str]) -> Any:
    if isinstance(value, str):

        def one(found: re.Match[str]) -> str:
            token = found.group(0)
            if token in ("{{", "}}"):
                return token[0]
            return values.get(found.group(1), token)

        return PLACEHOLDER.sub(one, value)
    if isinstance(value, Mapping):
        return {key: _substitute(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, values) for item in value]
    return value


def _tokens(chars: int) -> int:
    return (chars + 3) // 4


class ScriptedModel:
    """A model answering from rules; see the module docstring and the README for the format."""

    provider: ClassVar[str] = "scripted"

    def __init__(
        self, rules: Sequence[Rule], *, spec: str = "scripted:<inline>", clock: Clock | None = None
    ) -> None:
        self._rules = tuple(rules)
        self._spec = spec
        self._clock: Clock = clock if clock is not None else SystemClock()

    @property
    def spec(self) -> str:
        return self._spec

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    @classmethod
    def from_rules(
        cls, data: Mapping[str, Any], *, source: str = "<inline>", clock: Clock | None = None
    ) -> ScriptedModel:
        """Build from already-decoded data (``{"rules": [...]}``); raises ModelSpecError."""
        return cls(parse_rules(data, source=source), spec=f"scripted:{source}", clock=clock)

    @classmethod
    def from_path(cls, path: str | Path, *, clock: Clock | None = None) -> ScriptedModel:
        """Load a ``.toml`` or ``.json`` rules file; any problem is a ModelSpecError."""
        return cls(load_rules(path), spec=f"scripted:{path}", clock=clock)

    @classmethod
    def builtin(cls, *, clock: Clock | None = None) -> ScriptedModel:
        """The built-in script (``default_script.toml``), used when no model is configured."""
        return cls(_builtin_rules(), spec=BUILTIN_SPEC, clock=clock)

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        turn = _turn_of(system, messages, tools)
        for rule in self._rules:
            values = _matches(rule, turn)
            if values is None:
                continue
            if rule.sleep > 0:
                # As an HTTP model's try: no longer than the turn has left (turn_time.py).
                allowed = bounded_timeout(rule.sleep)
                self._clock.sleep(allowed)
                if allowed < rule.sleep:
                    raise TurnTimeUp(
                        f"the scripted rule {rule.name!r} sleeps {rule.sleep:g}s, "
                        f"more than the {allowed:.1f}s the turn had left of "
                        "SOULFLEET_TURN_MAX_SECONDS"
                    )
            text = _substitute(rule.text, values) if rule.text is not None else ""
            calls = tuple(
                ToolCall(
                    id=f"call_{len(messages)}_{i}",
                    name=call.tool,
                    arguments=_substitute(call.args, values),
                )
                for i, call in enumerate(rule.calls)
            )
            return self._completion(system, messages, text, calls, rule.name)
        return self._completion(system, messages, FALLBACK_TEXT, (), None)

    @staticmethod
    def _completion(
        system: str,
        messages: Sequence[Message],
        text: str,
        calls: tuple[ToolCall, ...],
        rule: str | None,
    ) -> Completion:
        seen = len(system) + sum(len(m.content) for m in messages)
        said = len(text) + sum(len(c.name) + len(json.dumps(dict(c.arguments))) for c in calls)
        return Completion(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=_tokens(seen), output_tokens=_tokens(said)),
            stop_reason="tool_use" if calls else f"rule:{rule}" if rule else "fallback",
        )


@lru_cache(maxsize=1)
def _builtin_rules() -> tuple[Rule, ...]:
    # Parsed once per process: the packaged file cannot change under us, and rules are frozen.
    source = "workers/persona/models/default_script.toml"
    resource = importlib.resources.files("workers.persona.models").joinpath("default_script.toml")
    return parse_rules(decode(resource.read_text(encoding="utf-8"), ".toml", source), source=source)

"""What the model sees of the ``memory`` tool and what it may send: descriptions, schema, checks.

Kept apart from :mod:`workers.persona.memory` (which does the file work) because this half is a
contract with the model, and it is pinned byte for byte: with the notes tier off, the schema and
description must be identical to the plain tool's, so both are built from constants here and
tests compare them directly. Every argument check returns a message the model can act on:
what was wrong, and what to send instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NOTES_DIR",
    "MemoryRequest",
    "describe",
    "is_unflushed",
    "parse_request",
    "schema",
    "target_label",
    "unflushed_message",
    "valid_note_slug",
]

NOTES_DIR = "memory"

_SLUG = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SLUG_RULE = (
    "a slug is 1-64 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit, "
    "with no '..'"
)
_FILES = {"self": "MEMORY.md", "user": "USER.md"}
_WRITES = ("add", "replace", "remove")
_READS = ("read", "list")
_KEYS = frozenset({"action", "target", "text", "with"})
_LINE_BREAKS = re.compile(r"\s*(?:\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029])\s*")
# Control characters an entry may not write (tab, CR and LF are text; line breaks a soul file
# cannot hold are collapsed before this check): a NUL byte or a terminal escape sequence in a
# memory file rides in every later system prompt and reaches whoever cats the file.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f]")

_PLAIN_DESCRIPTION = (
    "Your durable memory: two Markdown files in your persona directory that are loaded into your "
    'system prompt at the start of every session. target "self" (the default) is MEMORY.md, '
    'your own notes; target "user" is USER.md, what you know about the user. Actions: "add" '
    'appends text as one "- text" entry; "replace" swaps the FIRST occurrence of text for '
    '`with`; "remove" deletes the FIRST occurrence of text. Writes are saved to disk at once but '
    "do not change your current system prompt: they load at the start of your next session. A "
    "replace or remove whose text is not found is an error and changes nothing, so copy the text "
    "exactly as it appears."
)

_NOTES_DESCRIPTION = (
    "Your durable memory, for what should outlive this conversation: facts, decisions, "
    "preferences, commitments and lessons that will matter in later sessions. Skip chatter, "
    "passing details and anything you can look up again. Targets: "
    '"self" (the default) is MEMORY.md, a short index loaded into your system prompt at the '
    'start of every session; "user" is USER.md, what you know about the user, also loaded every '
    'session; "note:<slug>" is memory/<slug>.md, a topic note for the details, never loaded '
    f"automatically ({_SLUG_RULE}). Keep MEMORY.md brief and point to notes from it (for "
    'example "- project atlas: see note:project-atlas") instead of copying details into it. '
    'Actions: "add" appends text as one "- text" entry (the first add to a note creates it); '
    '"replace" swaps the FIRST occurrence of text for `with`; "remove" deletes the FIRST '
    'occurrence of text; "read" returns a target\'s current content; "list" lists your notes. '
    "Writes are saved to disk at once but do not change your current system prompt: they load "
    "at the start of your next session. A replace or remove whose text is not found is an error "
    "and changes nothing, so copy the text exactly as it appears."
)

_PLAIN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": list(_WRITES),
            "description": "add an entry, or replace / remove the first occurrence of text.",
        },
        "target": {
            "type": "string",
            "enum": ["self", "user"],
            "description": "self (default): MEMORY.md, your notes. user: USER.md, about the user.",
        },
        "text": {
            "type": "string",
            "description": "add: the new entry (one line). replace/remove: the exact text to find.",
        },
        "with": {"type": "string", "description": "replace only: the text to put in its place."},
    },
    "required": ["action", "text"],
    "additionalProperties": False,
}

_NOTES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": [*_WRITES, *_READS],
            "description": "add an entry; replace / remove the first occurrence of text; "
            "read a target; list your notes.",
        },
        "target": {
            "type": "string",
            "pattern": r"^(self|user|note:[a-z0-9][a-z0-9._-]{0,63})$",
            "description": "self (default): MEMORY.md, your index. user: USER.md, about the user. "
            "note:<slug>: memory/<slug>.md, a topic note.",
        },
        "text": {
            "type": "string",
            "description": "add: the new entry (one line). replace/remove: the exact text to "
            "find. Not used by read and list.",
        },
        "with": {"type": "string", "description": "replace only: the text to put in its place."},
    },
    "required": ["action"],
    "additionalProperties": False,
}


def valid_note_slug(slug: object) -> bool:
    """``^[a-z0-9][a-z0-9._-]{0,63}$`` and no ``..``: no separators, no traversal."""
    return isinstance(slug, str) and _SLUG.fullmatch(slug) is not None and ".." not in slug


def describe(*, notes: bool) -> str:
    """The tool description; notes off is exactly the plain tool's."""
    return _NOTES_DESCRIPTION if notes else _PLAIN_DESCRIPTION


def schema(*, notes: bool) -> dict[str, Any]:
    """A fresh copy of the input schema (callers may mutate it); notes off is the plain one.

    Parsed from its JSON text: a tool hands the model its schema every turn, and ``json.loads``
    of it takes about a third of the time of ``copy.deepcopy`` (10 vs 29 µs here)."""
    copied: dict[str, Any] = json.loads(_SCHEMA_JSON[notes])
    return copied


def target_label(target: str) -> str:
    """How messages name a target: ``MEMORY.md``, ``USER.md``, ``note:x (memory/x.md)``."""
    if target.startswith("note:"):
        return f"{target} ({NOTES_DIR}/{target[5:]}.md)"
    return _FILES.get(target, target)


_UNFLUSHED = "but flushing it to disk failed"


def unflushed_message(label: str, error: OSError) -> str:
    """What a write that was applied but perhaps not made durable answers (a flush failed):
    never "nothing was changed", which would have the model repeat it."""
    problem = error.strerror or str(error)
    return (
        f"{label} was changed, {_UNFLUSHED} ({problem}): the change may not survive a crash "
        "of the machine. Do not repeat it; read the file to check it."
    )


def is_unflushed(answer: str) -> bool:
    """Whether a recorded answer is :func:`unflushed_message`'s (an error, when replayed)."""
    return _UNFLUSHED in answer and answer.endswith("read the file to check it.")


@dataclass(frozen=True, slots=True)
class MemoryRequest:
    """One checked call: what to do, to which file (relative to the persona directory)."""

    action: str
    target: str
    relative: str
    text: str = ""
    with_: str = ""
    collapsed: bool = False


def _string(arguments: Mapping[str, Any], key: str, notes: bool) -> str | None:
    """The string value of ``key``; None when absent or null. Raises ValueError with a message."""
    value = arguments.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        hint = _hint(key, notes)
        raise ValueError(f"'{key}' must be a string, got {type(value).__name__}: {hint}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        hint = _hint(key, notes)
        raise ValueError(f"'{key}' contains invalid Unicode (a lone surrogate): {hint}.") from None
    return value


def _actions(notes: bool) -> tuple[str, ...]:
    return (*_WRITES, *_READS) if notes else _WRITES


def _targets(notes: bool) -> str:
    return '"self", "user" or "note:<slug>"' if notes else '"self" or "user"'


def _hint(key: str, notes: bool) -> str:
    """What ``key`` should hold, for an error message (built only when one is raised)."""
    if key == "action":
        return f"one of {', '.join(_actions(notes))}"
    if key == "target":
        return _targets(notes)
    return "the entry or the exact text to find" if key == "text" else "the replacement text"


def parse_request(arguments: object, *, notes: bool, max_entry_bytes: int) -> MemoryRequest | str:
    """A checked request, or the error message for the model."""
    if not isinstance(arguments, Mapping):
        return (
            "memory arguments must be a JSON object, for example "
            f'{{"action": "add", "text": "prefers short answers"}}; got {type(arguments).__name__}.'
        )
    try:
        return _checked(arguments, notes=notes, max_entry_bytes=max_entry_bytes)
    except ValueError as error:
        return str(error)


def _checked(arguments: Mapping[Any, Any], *, notes: bool, max_entry_bytes: int) -> MemoryRequest:
    unknown = sorted(str(key) for key in arguments if key not in _KEYS)
    if unknown:
        raise ValueError(
            f"unknown argument(s) {', '.join(unknown)}: memory takes action, target, text, with."
        )
    actions = _actions(notes)
    action = _string(arguments, "action", notes)
    target = _string(arguments, "target", notes) or "self"
    text = _string(arguments, "text", notes)
    with_ = _string(arguments, "with", notes)
    if action is None:
        raise ValueError(f"missing 'action': use one of {', '.join(actions)}.")
    if action not in actions:
        extra = (
            " (read and list come with the notes tier: `notes = true` in persona.toml)"
            if action in _READS
            else ""
        )
        raise ValueError(f"unknown action {action!r}{extra}: use one of {', '.join(actions)}.")
    relative = _relative(target, notes=notes)
    if with_ is not None and action != "replace":
        raise ValueError(f"'with' is only used by replace; {action} does not take it.")
    if action in _READS:
        return MemoryRequest(action, target, relative)
    if text is None or not text.strip():
        what = "the entry to add" if action == "add" else "the exact existing text to find"
        raise ValueError(f"missing or empty 'text': {action} needs {what}.")
    if action == "replace" and with_ is None:
        raise ValueError(
            "replace needs 'with': the text to put in place of 'text' (use remove to delete)."
        )
    collapsed = False
    if action == "add":
        one_line = _LINE_BREAKS.sub(" ", text.strip())
        collapsed, text = one_line != text.strip(), one_line
        _bounded("text", text, max_entry_bytes)
    elif action == "replace" and with_ and target in _FILES:
        # MEMORY.md and USER.md are composed into the soul line by line: a replacement that
        # brought its own line breaks could start a line of its own, a forged "## IDENTITY.md"
        # section header included. Notes are documents, read on demand: they keep theirs.
        one_line = _LINE_BREAKS.sub(" ", with_)
        collapsed, with_ = one_line != with_, one_line
    _bounded("with", with_ or "", max_entry_bytes)
    for key, value in (("text", text if action == "add" else ""), ("with", with_ or "")):
        if (found := _CONTROL.search(value)) is not None:
            raise ValueError(
                f"'{key}' contains the control character U+{ord(found.group()):04X} at "
                f"position {found.start()}: memory entries are plain text (a NUL byte or a "
                "terminal escape sequence may not be written). Nothing was changed."
            )
    return MemoryRequest(action, target, relative, text, with_ or "", collapsed)


def _bounded(key: str, value: str, limit: int) -> None:
    size = len(value.encode("utf-8"))
    if size > limit:
        raise ValueError(
            f"'{key}' is {size} bytes; one entry may be at most {limit} bytes. "
            "Shorten it, or split it into several entries (or a note)."
        )


def _relative(target: str, *, notes: bool) -> str:
    """The target's path relative to the persona directory; ValueError names a bad target."""
    if target in _FILES:
        return _FILES[target]
    if target.startswith("note:"):
        if not notes:
            raise ValueError(
                'note targets are not enabled for this persona: use target "self" (MEMORY.md) '
                'or "user" (USER.md).'
            )
        slug = target[5:]
        if not valid_note_slug(slug):
            raise ValueError(
                f"invalid note slug {slug!r}: {_SLUG_RULE}; for example note:project-atlas."
            )
        return f"{NOTES_DIR}/{slug}.md"
    raise ValueError(f"unknown target {target!r}: use {_targets(notes)}.")


_SCHEMA_JSON: dict[bool, str] = {True: json.dumps(_NOTES_SCHEMA), False: json.dumps(_PLAIN_SCHEMA)}

"""What each write action of the ``memory`` tool does to a file's bytes, and what it answers.

Pure functions over bytes (no files, no locks): :mod:`workers.persona.memory` reads the file
under its lock, calls :func:`edit` and writes what it returns. Bytes the action does not touch
(including invalid UTF-8 a person left there) survive exactly; ``replace``/``remove`` act on
the FIRST occurrence; a ``remove`` that leaves its line empty or a bare ``-`` drops that line
too; no edit may grow a file past :data:`~workers.persona.home.MAX_FILE_BYTES`.
"""

from __future__ import annotations

import re

from workers.persona.home import BOOTSTRAP_ORDER, MAX_FILE_BYTES
from workers.persona.memory_spec import MemoryRequest, target_label

__all__ = ["FileFull", "drop_husk", "edit", "not_found"]

_NEXT = "It loads into your system prompt at the start of your next session."
_NOTE_SAVED = "Notes are never loaded automatically: read it when you need it."


class FileFull(str):
    """An error message refusing an edit because the file is, or would be, over
    :data:`~workers.persona.home.MAX_FILE_BYTES`: unlike a text not found, the operator must
    hear of it (the persona can no longer remember anything there)."""

    __slots__ = ()


def edit(request: MemoryRequest, current: bytes | None) -> tuple[bytes, str] | str:
    """The new file bytes and the success message, or an error message (nothing to write)."""
    label = target_label(request.target)
    after = _NOTE_SAVED if request.target.startswith("note:") else _NEXT
    data = current or b""
    if len(data) > MAX_FILE_BYTES:
        return FileFull(
            f"{label} is larger than {MAX_FILE_BYTES} bytes, the most the memory tool edits "
            "(and the most a session loads). It cannot be changed with this tool until a person "
            "trims it. Nothing was changed."
        )
    needle = request.text.encode("utf-8")
    if request.action == "add":
        separator = b"\n" if data and not data.endswith(b"\n") else b""
        new = data + separator + b"- " + needle + b"\n"
        note = " (newlines in text were collapsed to spaces)" if request.collapsed else ""
        message = f"Added an entry to {label}{note}. {after}"
    else:
        at = data.find(needle)
        if at < 0:
            return not_found(request)
        if request.action == "replace":
            new = data[:at] + request.with_.encode("utf-8") + data[at + len(needle) :]
            note = " (newlines in with were collapsed to spaces)" if request.collapsed else ""
            message = f"Replaced the first occurrence in {label}{note}. {after}"
        else:
            new = drop_husk(data[:at] + data[at + len(needle) :], at)
            message = f"Removed the first occurrence from {label}. {after}"
    if (
        request.action != "add"  # an added entry is one line behind its "- ": never a header
        and not request.target.startswith("note:")
        and _headers(new) > _headers(data)
    ):
        # MEMORY.md and USER.md are composed into the soul: a line of their own reading
        # "## IDENTITY.md" would pose as another section of it (a whole-line replace, or a
        # remove that strips the bullet off an added "- ## SOUL.md").
        return (
            f"this {request.action} would start a line of {label} with a soul section header "
            "(## followed by a bootstrap file's name), which it may not hold. Nothing was "
            "changed."
        )
    if len(new) > MAX_FILE_BYTES:
        return FileFull(
            f"this {request.action} would make {label} {len(new)} bytes, over the "
            f"{MAX_FILE_BYTES}-byte limit. Nothing was changed. Remove or shorten entries first."
        )
    return new, message


def not_found(request: MemoryRequest) -> str:
    return (
        f"text not found in {target_label(request.target)}: {request.text!r}. Nothing was "
        "changed. Copy the text exactly as it appears in the file (same spelling, spacing, "
        "case)."
    )


def drop_husk(data: bytes, at: int) -> bytes:
    """Drop the line containing offset ``at`` if a removal left it empty or a bare bullet."""
    start = data.rfind(b"\n", 0, at) + 1
    end = data.find(b"\n", at)
    line = data[start : len(data) if end < 0 else end]
    if line.strip() not in (b"", b"-"):
        return data
    return data[:start] + (b"" if end < 0 else data[end + 1 :])


_HEADER = re.compile(
    rb"^[ \t]*##[ \t]+(?:" + b"|".join(re.escape(n.encode()) for n in BOOTSTRAP_ORDER) + rb")\b",
    re.MULTILINE | re.IGNORECASE,
)


def _headers(data: bytes) -> int:
    """How many lines of ``data`` read as a composed soul's section header."""
    return len(_HEADER.findall(data))

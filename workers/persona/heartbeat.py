"""The heartbeat contract: the wake prompt and the silent-no-op sentinel (docs/persona.md §3).

These two strings are a cross-port contract: every port wakes a persona with the same prompt and
treats the same sentinel as "nothing to report". Silence is the default, so a reply counts as
silent as soon as it CONTAINS the sentinel anywhere: a model that says "All quiet. HEARTBEAT_OK"
has still chosen silence, and surfacing it would turn a heartbeat into a cron job with a bill.
"""

from __future__ import annotations

import re

__all__ = ["HEARTBEAT_OK", "HEARTBEAT_PROMPT", "is_silent", "without_comments"]

HEARTBEAT_OK = "HEARTBEAT_OK"

HEARTBEAT_PROMPT = (
    "Heartbeat. Read your HEARTBEAT.md section and follow it. "
    "If nothing needs attention, reply HEARTBEAT_OK."
)


def is_silent(reply: str) -> bool:
    """True when ``reply`` contains :data:`HEARTBEAT_OK` (case-sensitive, anywhere)."""
    return HEARTBEAT_OK in reply


# An unclosed comment runs to the end, as a Markdown renderer shows it.
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)


def without_comments(text: str) -> str:
    """``text`` (a persona file) without its HTML comments and byte-order mark: notes to the
    people who edit it, not asks. A blank HEARTBEAT.md is judged on this, and the scripted
    model's section tests read it, so a ``due:`` line someone commented out is not due."""
    return _COMMENT.sub("\n", text.replace("\ufeff", ""))

"""A lane's last paid summary, kept so a retried turn does not pay for it again.

A turn over ``session.max_tokens`` pays for a summary of the session's older part before its
own model call (:mod:`workers.persona.compaction`), often the costliest call of the turn (its
input is all of that history). If the turn then fails (a provider error, a crash), nothing of
it is committed, so its retry starts from the same session and would summarize the very same
history again: on every backoff step of an outage.

So the summary text is kept, as soon as it is paid for, in ``sessions/<lane>/SUMMARY.json``
(one file per lane, replaced by each new summary), under a key that is a hash of exactly what
was summarized (:func:`summary_key`). A compaction whose key matches reuses the text without a
model call; any other history misses and pays as before. A missing, torn or foreign file is a
miss, and a file that cannot be written only costs the saving (a warning): the turn never
fails for it. Nothing else reads the file; it lives beside the lane's session states, confined
to the persona's home like them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import structlog

from workers.persona.errors import PersonaError
from workers.persona.files import confined, make_dirs, read_prefix, real_root
from workers.persona.writes import atomic_write_bytes

__all__ = ["SUMMARY_NAME", "SummaryFile", "summary_key"]

SUMMARY_NAME = "SUMMARY.json"
#: A summary is cut to half a session's budget; this bounds what a read takes in regardless.
_MAX_BYTES = 8 * 1024 * 1024

_log = structlog.get_logger("soulfleet.session")


def summary_key(instructions: str, request: str) -> str:
    """What a summary was asked for, as a key: the instructions and the rendered history."""
    digest = hashlib.blake2b(digest_size=20)
    for part in (instructions, request):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


class SummaryFile:
    """The last summary paid for on one lane of one persona home."""

    def __init__(self, home: str | os.PathLike[str], lane: str) -> None:
        self.home = Path(real_root(home))
        self.relative = f"sessions/{lane}/{SUMMARY_NAME}"

    def recall(self, key: str) -> str | None:
        """The summary kept under ``key``, or None (none, another history's, unreadable)."""
        try:
            raw = read_prefix(confined(self.home, self.relative), _MAX_BYTES)
            if raw is None or len(raw) > _MAX_BYTES:
                return None
            data = json.loads(raw)
        except (OSError, PersonaError, ValueError, RecursionError) as exc:
            _log.warning("session.summary_unreadable", path=self.relative, error=str(exc))
            return None
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        text = data.get("text")
        return text if isinstance(text, str) and text else None

    def keep(self, key: str, text: str) -> None:
        """Keep ``text`` as the summary for ``key`` (durably; a failure is only logged)."""
        data = (json.dumps({"key": key, "text": text}) + "\n").encode()
        try:
            path = confined(self.home, self.relative)
            make_dirs(self.home, path.parent)
            atomic_write_bytes(path, data)
        except (OSError, PersonaError) as exc:
            _log.warning("session.summary_not_kept", path=self.relative, error=str(exc))

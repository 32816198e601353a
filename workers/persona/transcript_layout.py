"""How a lane's transcripts are laid out on disk: the names every reader and writer shares.

    <home>/transcripts/<lane>/<started_ms>-<conversation_id>.jsonl

``started_ms`` is the conversation's start time in epoch milliseconds, zero-padded to
:data:`STAMP_DIGITS` digits, so a plain ``ls`` orders a lane's conversations oldest first
without opening a file. Lane names and conversation ids are slugs (one safe path segment), so a
name can never lead out of its lane directory.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

import structlog

from workers.persona.errors import PersonaFileError
from workers.persona.files import read_prefix
from workers.persona.messages import Message

__all__ = [
    "FORMAT_VERSION",
    "MAX_TRANSCRIPT_BYTES",
    "SUFFIX",
    "TRANSCRIPTS_DIR",
    "ConversationInfo",
    "TranscriptRecord",
    "file_name",
    "local_lane",
    "name_slug",
    "parse_file_name",
    "read_records",
    "require_name",
    "valid_transcript_name",
]

TRANSCRIPTS_DIR = "transcripts"
SUFFIX = ".jsonl"
STAMP_DIGITS = 15
#: The header line's ``transcript`` field.
FORMAT_VERSION = 1
#: The most of one conversation file a reader takes in. A turn is bounded by its budget and
#: each reply by SOULFLEET_REPLY_MAX_BYTES, so only a hand-grown file gets near it.
MAX_TRANSCRIPT_BYTES = 64 * 1024 * 1024
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")

log = structlog.get_logger("soulfleet.transcripts")


def valid_transcript_name(name: object) -> bool:
    """Whether ``name`` may be a lane name or a conversation id (one safe path segment)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None and ".." not in name


def local_lane(name: str) -> str:
    """The lane a run outside the fleet keeps a persona's session and transcripts under: the
    persona's directory name, or for a name that cannot be one (``zoë``, ``my persona``,
    ``.hidden``) the nearest that can (``zoe``, ``my-persona``, ``hidden``). Only that persona's
    own home holds it: one home whose agent is given two names that meet in one lane (``a b``
    and ``a-b``, by ``from_dir(name=...)``) keeps one session for both."""
    if valid_transcript_name(name):
        return name
    slug = name_slug(name, 128)
    return slug if valid_transcript_name(slug) else "persona"


def name_slug(name: str, limit: int) -> str:
    """``name`` as letters, digits, '.', '_' and '-' only, at most ``limit`` long: accents
    folded (``zoë``: ``zoe``), every other run of characters one '-', no '..', nothing to strip
    at either end ("" when nothing is left)."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_name).replace("..", ".").strip("-._")[:limit]


def require_name(kind: str, name: object) -> str:
    """``name`` if :func:`valid_transcript_name`, else ValueError saying what a name may be."""
    if not valid_transcript_name(name):
        raise ValueError(
            f"invalid {kind} {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter, digit or '_', without '..'"
        )
    assert isinstance(name, str)
    return name


@dataclass(frozen=True)
class ConversationInfo:
    """One conversation (one turn) of one lane; ``started_at`` is epoch seconds (ms precision)."""

    id: str
    lane: str
    started_at: float


@dataclass(frozen=True)
class TranscriptRecord:
    """One message of a conversation, with the time it was recorded."""

    conversation: str
    at: float
    message: Message


def file_name(info: ConversationInfo) -> str:
    """The file name of ``info``'s conversation in its lane directory."""
    return f"{round(info.started_at * 1000):0{STAMP_DIGITS}d}-{info.id}{SUFFIX}"


def parse_file_name(lane: str, name: str) -> ConversationInfo | None:
    """The conversation a lane directory's file ``name`` holds; None for any other file."""
    if not name.endswith(SUFFIX) or len(name) <= STAMP_DIGITS + 1 + len(SUFFIX):
        return None
    stamp, dash, rest = name[:STAMP_DIGITS], name[STAMP_DIGITS], name[STAMP_DIGITS + 1 :]
    conversation = rest.removesuffix(SUFFIX)
    if not stamp.isdigit() or dash != "-" or not valid_transcript_name(conversation):
        return None
    return ConversationInfo(id=conversation, lane=lane, started_at=int(stamp) / 1000)


def read_records(conversation_id: str, path: str) -> Iterator[TranscriptRecord]:
    """The readable records of the conversation file at ``path``, in order: a torn or malformed
    line (a crash mid-write, a hand edit) is skipped with a structured warning, never raised."""
    try:
        raw = read_prefix(path, MAX_TRANSCRIPT_BYTES, follow_symlinks=False)
    except PersonaFileError as exc:
        log.warning("transcript.unreadable", path=str(path), error=exc.problem)
        return
    if raw is None:
        return  # pruned since it was listed
    if len(raw) > MAX_TRANSCRIPT_BYTES:
        # Keep the whole lines within the cap; the cut one would only parse as torn.
        raw = raw[: raw.rfind(b"\n", 0, MAX_TRANSCRIPT_BYTES) + 1]
        log.warning("transcript.truncated", path=str(path), cap_bytes=MAX_TRANSCRIPT_BYTES)
    for number, chunk in enumerate(raw.split(b"\n"), start=1):
        if not chunk.strip():
            continue
        record = _parse_line(conversation_id, path, number, chunk)
        if record is not None:
            yield record


def _parse_line(
    conversation_id: str, path: str, number: int, chunk: bytes
) -> TranscriptRecord | None:
    try:
        data = json.loads(chunk.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        log.warning("transcript.torn_line", path=str(path), line=number, bytes=len(chunk))
        return None
    if isinstance(data, dict) and "transcript" in data and "message" not in data:
        return None  # the header
    try:
        if not isinstance(data, dict):
            raise TypeError("a record must be a JSON object")
        at = data["at"]
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise TypeError("'at' must be a number")
        return TranscriptRecord(conversation_id, float(at), Message.from_dict(data["message"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("transcript.bad_record", path=str(path), line=number, error=str(exc))
        return None

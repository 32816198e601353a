"""The model answers a turn's work has bought, kept so its retry does not buy them again.

A turn that fails after some of its model calls were answered (a provider error past the
call's own retries on its third call, a 429 asking for more than the call waits) commits
nothing, and its retry runs the turn again from the same session: it sends the very requests
its failed attempt sent, and paid for the answers twice. Its memory writes were never the
problem (the write ledger answers a repeated one); its model calls were.

So each answered call is appended, as soon as it is answered, to ``sessions/<lane>/.calls.jsonl``
(one file per lane; its first line names the turn's work id, so a later turn's first call
starts the file anew), under a key that is a hash of what was sent: the conversation and the
tools (:func:`call_key`). A call whose key is there is answered from the file, costing
nothing (no usage record, no gate slot, no provider; its usage still counts against the
turn's token budget). The system prompt is left out of the key on
purpose: within one work id the only thing that changes it between attempts is the failed
attempt's own memory write (a new session composes its soul at the turn's start), and the
answer bought for the same conversation is the one to replay.

Not fsynced: a crash of the machine loses at most what a retry then pays for again, and a
torn or foreign file is read as empty. The file is confined to the persona's home and never
written by the model; a leading dot keeps it out of what the dreamer counts as new.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from workers.persona.errors import PersonaError
from workers.persona.files import confined, make_dirs, read_prefix, real_root
from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.writes import open_regular

__all__ = ["CALLS_NAME", "MAX_BYTES", "CallLog", "call_key"]

CALLS_NAME = ".calls.jsonl"
#: A log this large keeps no more answers (a turn of huge tool-call arguments): it only saves.
MAX_BYTES = 8 * 1024 * 1024

_log = structlog.get_logger("soulfleet.turn")


def call_key(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
    """What a call sent (the conversation and the tools), as a key."""
    sent = {
        "messages": [message.to_dict() for message in messages],
        "tools": [[tool.name, tool.description, tool.input_schema] for tool in tools],
    }
    encoded = json.dumps(sent, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(encoded.encode("utf-8", "surrogatepass"), digest_size=20).hexdigest()


class CallLog:
    """The answered calls of one lane's current work (``work``: the turn's work id)."""

    def __init__(self, home: str | os.PathLike[str], lane: str, work: str) -> None:
        self.home = Path(real_root(home))
        self.relative = f"sessions/{lane}/{CALLS_NAME}"
        self.work = work
        self._answers: dict[str, Completion] | None = None
        self._size = 0
        #: the file on disk ends in a line a crash tore (no newline): the next append starts
        #: a line of its own instead of being glued onto the fragment and lost
        self._torn = False

    def recall(self, key: str) -> Completion | None:
        """The answer bought for ``key`` in this work. Not billed again (no provider, no usage
        record), but it carries the usage it was bought with: the turn's token budget bounds
        the conversation the turn builds, replayed calls included."""
        answer = self._load().get(key)
        if answer is None:
            return None
        _log.info("model.call_replayed", key=key[:12])
        return answer

    def forget(self) -> None:
        """Drop this work's answers: the provider refused a request built on them (a 400), so
        a retry (after ``soulfleet revive``) must ask again, not send that request again."""
        self._answers = {}
        self._size = 0
        self._torn = False
        try:
            os.unlink(confined(self.home, self.relative))
        except FileNotFoundError:
            pass
        except (OSError, PersonaError) as exc:
            _log.warning("model.calls_not_forgotten", path=self.relative, error=str(exc)[:300])

    def keep(self, key: str, answer: Completion) -> None:
        """Keep ``answer`` for ``key`` (a failure to write only loses the saving)."""
        answers = self._load()
        line = json.dumps({"key": key, "answer": _encoded(answer)}, ensure_ascii=False) + "\n"
        data = line.encode("utf-8", "surrogatepass")
        fresh = not answers and self._size == 0
        if fresh:
            data = (json.dumps({"work": self.work}) + "\n").encode() + data
        elif self._torn:
            data = b"\n" + data
        if self._size + len(data) > MAX_BYTES:
            return
        try:
            path = confined(self.home, self.relative)
            flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fresh else os.O_APPEND)
            try:
                fd = open_regular(path, flags, 0o600)
            except FileNotFoundError:  # the lane's first turn: its directory is made here
                make_dirs(self.home, path.parent)
                fd = open_regular(path, flags, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except (OSError, PersonaError) as exc:
            _log.warning("model.call_not_kept", path=self.relative, error=str(exc)[:300])
            return
        self._size += len(data)
        self._torn = False
        answers[key] = answer

    def _load(self) -> dict[str, Completion]:
        """This work's answers on file, read once (another work's, or a torn file: none)."""
        if self._answers is not None:
            return self._answers
        self._answers = {}
        try:
            raw = read_prefix(confined(self.home, self.relative), MAX_BYTES)
        except (OSError, PersonaError):
            raw = None
        if not raw or len(raw) > MAX_BYTES:
            return self._answers
        lines = raw.split(b"\n")
        try:
            header = json.loads(lines[0])
        except (ValueError, RecursionError):
            return self._answers
        if not isinstance(header, dict) or header.get("work") != self.work:
            return self._answers  # a later turn's first keep starts the file anew
        self._size = len(raw)
        self._torn = not raw.endswith(b"\n")
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                self._answers[str(entry["key"])] = _decoded(entry["answer"])
            except (ValueError, KeyError, TypeError, RecursionError):
                continue  # a line torn by a crash mid-append
        return self._answers


def _encoded(answer: Completion) -> dict[str, Any]:
    return {
        "text": answer.text,
        "tool_calls": [call.to_dict() for call in answer.tool_calls],
        "stop_reason": answer.stop_reason,
        "usage": answer.usage.to_dict(),
    }


def _decoded(data: Any) -> Completion:
    if not isinstance(data, dict):
        raise TypeError("an answer is an object")
    calls = tuple(ToolCall.from_dict(call) for call in data.get("tool_calls") or ())
    stop = data.get("stop_reason")
    spent = _usage(data.get("usage"))
    return Completion(str(data.get("text") or ""), calls, spent, stop if stop else None)


def _usage(data: Any) -> Usage:
    """The usage an answer was bought with (an older line without one: none)."""
    if not isinstance(data, dict):
        return Usage()
    names = ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_input_tokens")
    counts = [data.get(name, 0) for name in names]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return Usage()
    return Usage(*counts)

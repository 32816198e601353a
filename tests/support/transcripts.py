"""An in-memory TranscriptStore for dreamer and search tests that do not need files.

The durable store (FileTranscripts) has its own tests; this fake lets a test state exactly which
conversations exist and what was said in them, in a few lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.persona.messages import Message
from workers.persona.transcripts import ConversationInfo, TranscriptRecord

__all__ = ["MemoryTranscripts", "assistant", "tool_result", "user"]


def user(text: str) -> Message:
    """A user message."""
    return Message(role="user", content=text)


def assistant(text: str) -> Message:
    """An assistant message with text only."""
    return Message(role="assistant", content=text)


def tool_result(text: str, *, call_id: str = "call-1", name: str = "memory") -> Message:
    """A tool message answering ``call_id``."""
    return Message(role="tool", content=text, tool_call_id=call_id, name=name)


class MemoryTranscripts:
    """A TranscriptStore held in a dict; ``add`` records one whole conversation."""

    def __init__(self) -> None:
        self._infos: list[ConversationInfo] = []
        self._records: dict[str, list[TranscriptRecord]] = {}

    def add(
        self, conversation_id: str, *messages: Message, lane: str = "ava", at: float = 0.0
    ) -> ConversationInfo:
        """Record a conversation started at ``at``; its messages are one second apart."""
        info = ConversationInfo(id=conversation_id, lane=lane, started_at=at)
        self._infos.append(info)
        self._records[conversation_id] = [
            TranscriptRecord(conversation_id, at + index, message)
            for index, message in enumerate(messages)
        ]
        return info

    def conversations(self) -> Sequence[ConversationInfo]:
        return sorted(self._infos, key=lambda info: info.started_at)

    def messages(self, conversation_id: str) -> Sequence[TranscriptRecord]:
        return list(self._records.get(conversation_id, []))

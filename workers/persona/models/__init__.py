"""Model clients behind one small protocol: messages and tool specs in, a Completion out.

Spec strings choose the implementation (see :mod:`workers.persona.models.spec`):
``openai:<model>``, ``anthropic:<model>``, ``scripted:<path>``; empty or ``inherit`` means the
fleet default, and with none configured anywhere, the built-in scripted model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from workers.persona.messages import Completion, Message, ToolSpec

__all__ = ["Model"]


@runtime_checkable
class Model(Protocol):
    """One model. ``complete`` raises a :class:`~workers.persona.errors.ModelError` on failure."""

    @property
    def spec(self) -> str:
        """The spec string this model was built from (for logs; never holds a key)."""
        ...

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion: ...

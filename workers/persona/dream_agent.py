"""The dreamer: a persona's second agent, which folds what was said into what is remembered.

A dreamer is a plain :class:`~workers.persona.agent.AgentDef` (docs/persona.md §4), not new
machinery: its soul is ONE ``## HEARTBEAT.md`` section holding :data:`DREAM_PROMPT`, so the ordinary
heartbeat wake drives a pass and ``HEARTBEAT_OK`` keeps a pass with nothing to fold silent. Its
tools are EXACTLY ``memory`` (notes on) and ``transcript_search``: never the persona's own tools,
because a pass that could send mail or call APIs would be a second persona acting unprompted.

The soul (:mod:`workers.persona.dream_soul`) is read at call time: ``<dir>/DREAM.md`` is the
person's place to steer dreaming (what to keep, what to forget) and an edit applies to the next
pass.
"""

from __future__ import annotations

import os

from workers.persona.agent import AgentDef, default_name
from workers.persona.dream_soul import DREAM_FILE, DREAM_PROMPT, dream_soul
from workers.persona.home import persona_home
from workers.persona.transcripts import TranscriptStore

__all__ = ["DREAM_FILE", "DREAM_PROMPT", "dream_soul", "dreamer"]


def dreamer(
    path: str | os.PathLike[str],
    *,
    store: TranscriptStore,
    instructions: str | None = None,
    name: str | None = None,
    model: str = "inherit",
) -> AgentDef:
    """The dreamer over the persona at ``path``, searching ``store`` (docs/persona.md §4).

    Default name ``<basename(dir)>-dreamer``. Raises PersonaNotFound for a missing directory and
    TypeError when ``store`` is not a TranscriptStore.
    """
    home = persona_home(path)
    if not isinstance(store, TranscriptStore):
        raise TypeError(f"store must be a TranscriptStore (conversations, messages), got {store!r}")
    if instructions is not None and not isinstance(instructions, str):
        raise TypeError(f"instructions must be a string, got {instructions!r}")
    persona = default_name(path)
    return AgentDef(
        name=name if name is not None else f"{persona}-dreamer",
        home=home,
        does=f"Dreamer of {persona}: folds recent conversations into its memory notes.",
        model=model,
        tools=(),
        memory=True,
        notes=True,
        memory_index_cap=None,
        heartbeat=None,
        dream=None,
        kind="dreamer",
        instructions=instructions,
        store=store,
    )

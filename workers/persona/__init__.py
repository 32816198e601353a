"""The persona core: the directory is the agent.

Pure library: importing it never imports Celery or Redis, so the fleet and anyone embedding a
persona share one implementation. Names resolve lazily (PEP 562), so ``import workers.persona``
costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any

import structlog

if not structlog.is_configured():
    # Unconfigured, structlog prints every level to stdout: a library must not write its debug
    # lines into its caller's output (``run("personas/ava", "hi")`` did). Warnings and errors
    # go to stderr until the application configures structlog (every soulfleet process does,
    # workers/logs.py), which replaces this.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )

if TYPE_CHECKING:
    from workers.persona.agent import AgentDef, from_dir
    from workers.persona.dream_agent import DREAM_PROMPT, dreamer
    from workers.persona.driver import HeartbeatDriver, start_agent
    from workers.persona.heartbeat import HEARTBEAT_OK, HEARTBEAT_PROMPT, is_silent
    from workers.persona.home import BOOTSTRAP_ORDER, MAX_FILE_BYTES, compose_soul
    from workers.persona.inbox import InboxItem, render_inbox
    from workers.persona.loop import Budget, RunResult
    from workers.persona.memory import memory_tool, valid_note_slug
    from workers.persona.runner import as_tool, run
    from workers.persona.session import SessionConfig, SessionState
    from workers.persona.session_files import current_session
    from workers.persona.tools import FunctionTool, Tool, ToolResult, tool_factory
    from workers.persona.transcripts import FileTranscripts, TranscriptStore

__all__ = [
    "BOOTSTRAP_ORDER",
    "DREAM_PROMPT",
    "HEARTBEAT_OK",
    "HEARTBEAT_PROMPT",
    "MAX_FILE_BYTES",
    "AgentDef",
    "Budget",
    "FileTranscripts",
    "FunctionTool",
    "HeartbeatDriver",
    "InboxItem",
    "RunResult",
    "SessionConfig",
    "SessionState",
    "Tool",
    "ToolResult",
    "TranscriptStore",
    "as_tool",
    "compose_soul",
    "current_session",
    "dreamer",
    "from_dir",
    "is_silent",
    "memory_tool",
    "render_inbox",
    "run",
    "start_agent",
    "tool_factory",
    "valid_note_slug",
]

_WHERE = {
    "AgentDef": "agent",
    "from_dir": "agent",
    "DREAM_PROMPT": "dream_agent",
    "dreamer": "dream_agent",
    "HeartbeatDriver": "driver",
    "start_agent": "driver",
    "HEARTBEAT_OK": "heartbeat",
    "HEARTBEAT_PROMPT": "heartbeat",
    "is_silent": "heartbeat",
    "BOOTSTRAP_ORDER": "home",
    "MAX_FILE_BYTES": "home",
    "compose_soul": "home",
    "InboxItem": "inbox",
    "render_inbox": "inbox",
    "Budget": "loop",
    "RunResult": "loop",
    "memory_tool": "memory",
    "valid_note_slug": "memory",
    "as_tool": "runner",
    "run": "runner",
    "SessionConfig": "session",
    "SessionState": "session",
    "current_session": "session_files",
    "FunctionTool": "tools",
    "Tool": "tools",
    "ToolResult": "tools",
    "tool_factory": "tools",
    "FileTranscripts": "transcripts",
    "TranscriptStore": "transcripts",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'workers.persona' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"workers.persona.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

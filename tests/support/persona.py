"""Helpers for persona-core tests and benchmarks: persona directories and memory workers.

The worker functions live in an importable module (not a test file) so ``multiprocessing`` with
the ``spawn`` start method can find them in fresh interpreters.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from multiprocessing.synchronize import Event
from pathlib import Path

import structlog

from workers.persona.locks import LockMode
from workers.persona.memory import memory_tool

__all__ = [
    "at",
    "expected_entries",
    "heard_long_ago",
    "make_persona",
    "memory_churn",
    "memory_worker",
    "tree",
]


def at(year: int, month: int, day: int, hour: int, minute: int = 0) -> float:
    """Epoch seconds of a UTC wall-clock instant."""
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


def make_persona(root: Path, files: Mapping[str, str | bytes] | None = None) -> Path:
    """Create ``root`` (and parents) holding ``files`` (relative name -> text or bytes)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, content in (files or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_bytes(content.encode("utf-8"))
    return root


def heard_long_ago(home: Path, lane: str) -> float:
    """A lane whose one session state (and directory) dates from long ago; returns a dream
    pass time since which it heard nothing (for the dreamer's "anything new?" check)."""
    directory = home / "sessions" / lane
    directory.mkdir(parents=True)
    state = directory / "s1.f1.json"
    state.write_text("{}\n")
    os.utime(state, (100, 100))
    os.utime(directory, (100, 100))
    return time.time() - 5


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (files and directories), relative, '/'-separated."""
    found: set[str] = set()
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            found.add(Path(directory, name).relative_to(root).as_posix())
    return found


def _entry(worker: int, index: int) -> str:
    return f"[p{worker}:{index:03d}]"


def memory_churn(worker: int, count: int) -> list[dict[str, str]]:
    """The calls worker ``worker`` makes: ``count`` adds, plus replaces and removes of its own.

    Every 10 adds it replaces one of its earlier entries and removes another, so replace and
    remove interleave with other workers' adds. Entry texts are never substrings of each other.
    """
    calls: list[dict[str, str]] = []
    for index in range(count):
        calls.append({"action": "add", "text": _entry(worker, index)})
        if index % 10 == 4:
            old = _entry(worker, index - 1)
            calls.append({"action": "replace", "text": old, "with": f"{old[:-1]}:r]"})
        if index % 10 == 7:
            calls.append({"action": "remove", "text": _entry(worker, index - 2)})
    return calls


def expected_entries(worker: int, count: int) -> list[str]:
    """The lines worker ``worker``'s calls leave behind, in its own order."""
    lines: list[str] = []
    for index in range(count):
        entry = _entry(worker, index)
        if index % 10 == 5 and index + 2 < count:
            continue
        if index % 10 == 3 and index + 1 < count:
            entry = f"{entry[:-1]}:r]"
        lines.append(f"- {entry}")
    return lines


def memory_worker(
    path: str,
    *,
    target: str,
    worker: int,
    count: int,
    lock_mode: LockMode,
    start: Event,
) -> None:
    """Run :func:`memory_churn` against ``target``; exit non-zero on the first error result."""
    # One info line per write from four processes would drown the test output.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    notes = target.startswith("note:")
    tool = memory_tool(path, notes=notes, lock_mode=lock_mode, lock_timeout=60.0)
    calls = [{**call, "target": target} for call in memory_churn(worker, count)]
    start.wait(60)
    for call in calls:
        result = tool.execute(call)
        if result.is_error:
            print(f"worker {worker}: {call} -> {result.output}", file=sys.stderr, flush=True)
            sys.exit(1)

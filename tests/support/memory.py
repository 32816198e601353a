"""Shared helpers of the memory tool's and the locks' tests."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workers.persona.locks import LockMode, path_lock
from workers.persona.memory import MemoryTool

#: Scripted-model rules: the turn adds one memory entry, then waits SECONDS and answers.
REMEMBER_THEN_ANSWER = """
[[rules]]
name = "remember"
when = { tool_results = 0 }
calls = [{ tool = "memory", args = { action = "add", text = "The sky is green." } }]

[[rules]]
name = "then-answer"
when = { tool_results = 1 }
sleep = SECONDS
text = "noted"
"""


def remember_then_answer(seconds: float) -> str:
    """:data:`REMEMBER_THEN_ANSWER` answering after ``seconds``."""
    return REMEMBER_THEN_ANSWER.replace("SECONDS", f"{seconds:g}")


__all__ = ["held_by_child", "held_by_thread", "ok"]


def ok(tool: MemoryTool, **arguments: Any) -> str:
    """Run the tool; assert it did not answer with an error; its output."""
    result = tool.execute(arguments)
    assert not result.is_error, result.output
    return result.output


@contextmanager
def held_by_child(script: str, *args: str) -> Iterator[list[str]]:
    """A child process running ``python -c script args…`` that prints ``held …`` once it holds
    its lock and lets go when it reads a line. Yields the words of its ``held`` line; on exit
    tells it to let go and waits for it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().split()
        assert line[:1] == ["held"], line
        yield line
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(30)


@contextmanager
def held_by_thread(lock_file: str | Path, mode: LockMode = "local") -> Iterator[None]:
    """Hold ``lock_file`` (path_lock) on another thread of this process for the ``with`` body."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with path_lock(lock_file, mode=mode, timeout=5):
            entered.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(10), "the holder thread never got the lock"
        yield
    finally:
        release.set()
        holder.join()

"""The persona core's waits (workers/persona/waits.py): every place a turn blocks on something
other than its CPU runs inside the installed hook, so a worker can let another turn run."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.turns import Call, RecordingTool, ReplayModel, call, says
from workers.persona import waits
from workers.persona.clock import SystemClock, VirtualClock
from workers.persona.locks import path_lock
from workers.persona.loop import Budget, run_loop
from workers.persona.messages import Completion, Message
from workers.persona.tools import ToolResult
from workers.persona.transcripts import FileTranscripts
from workers.persona.writes import atomic_write_bytes


class Hook:
    """Counts the waits and says, per thread, whether one is under way."""

    def __init__(self) -> None:
        self.count = 0
        self.brief: list[bool] = []
        self._inside = threading.local()

    @contextlib.contextmanager
    def __call__(self, brief: bool) -> Iterator[None]:
        self.count += 1
        self.brief.append(brief)
        self._inside.on = True
        try:
            yield
        finally:
            self._inside.on = False

    @property
    def inside(self) -> bool:
        return bool(getattr(self._inside, "on", False))


@pytest.fixture
def hook() -> Iterator[Hook]:
    installed = Hook()
    waits.set_wait_hook(installed)
    try:
        yield installed
    finally:
        waits.set_wait_hook(None)


def test_without_a_hook_a_wait_does_nothing() -> None:
    with waits.waiting():
        pass


def test_a_durable_write_flushes_inside_the_hook(tmp_path: Path, hook: Hook) -> None:
    atomic_write_bytes(tmp_path / "MEMORY.md", b"fact\n")
    assert hook.count >= 1  # the file's fsync (and its directory's)
    assert all(hook.brief)  # a flush: the writer goes on at once after it


def test_a_transcript_sync_flushes_inside_the_hook(tmp_path: Path, hook: Hook) -> None:
    writer = FileTranscripts(tmp_path, lanes=["ava"]).open("ava", "s1", sync_each=False)
    writer.append(Message("user", "hello"))
    before = hook.count
    writer.sync()
    writer.close()
    assert hook.count > before


def test_a_real_sleep_is_a_wait(hook: Hook) -> None:
    SystemClock().sleep(0.001)
    assert hook.brief == [False]


def test_the_model_call_and_each_tool_call_run_inside_the_hook(hook: Hook) -> None:
    """The loop's two long waits: what the model and the tool saw while they ran."""
    seen: dict[str, bool] = {}

    def answer(_: Call) -> Completion:
        seen.setdefault("model", hook.inside)
        return says("done")

    def tool_fn(_: object) -> ToolResult:
        seen["tool"] = hook.inside
        return ToolResult("ok")

    model = ReplayModel(call(("echo", {"text": "x"})), answer)
    result = run_loop(
        system="## SOUL.md\n\nme",
        prompt="hello",
        tools=(RecordingTool(fn=tool_fn),),
        model=model,
        budget=Budget(),
        clock=VirtualClock(),
    )
    assert result.status == "done"
    assert seen == {"model": True, "tool": True}
    assert hook.brief == [False, False, False]  # model, tool, model: long waits
    assert not hook.inside


def test_waiting_for_a_lock_another_thread_holds_is_a_wait(tmp_path: Path, hook: Hook) -> None:
    """A second thread blocks on a file lock the first holds: it blocks inside the hook (a
    baton holder stuck on a lock would otherwise stop every other turn of its process)."""
    lock_file = tmp_path / ".locks" / "MEMORY.md.lock"
    lock_file.parent.mkdir()
    got = threading.Event()

    def second() -> None:
        with path_lock(lock_file, timeout=10):
            got.set()

    with path_lock(lock_file, timeout=10):
        before = hook.count
        thread = threading.Thread(target=second)
        thread.start()
        deadline = time.monotonic() + 10
        while hook.count == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hook.count > before  # it is waiting, and inside the hook
        assert not got.is_set()
    thread.join(timeout=10)
    assert got.is_set()

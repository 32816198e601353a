"""``[[tools.python]]``: a tool by import reference, run inside the worker with the same bounds.

``ref = "package.module:attribute"`` names either a :class:`~workers.persona.tools.Tool` or a
callable that takes no arguments and returns one (a factory, so a tool can read its own
configuration when a turn builds it), marked with :func:`~workers.persona.tools.tool_factory`:
an unmarked callable is refused, never called, or a persona file could name ``os:abort``. The
module must be importable by the worker (installed in its environment or on its
``PYTHONPATH``); the persona directory is never put on ``sys.path``, because a shared worker
must not import code a persona's files bring along.

Every problem with a ref (the module does not import, the attribute is missing, it is not a
Tool, the factory raises) is a :class:`PersonaConfigError` naming ``tools.python[n].ref`` and
the file: an invalid persona, reported like any other.

Its module's import and its factory get :data:`SETUP_TIMEOUT` on a thread of their own: one
still running then fails the turn (:class:`~workers.persona.errors.ToolSetupSlow`, naming the
ref; transient, so a cold import that finishes meanwhile costs one retry, and one that never
finishes ends in a dead-lettered lane).

A Python tool cannot be killed, so its timeout is enforced by running it on its own daemon
thread: at the timeout the model gets an error result and the turn goes on; the stuck call
keeps its thread until it returns.
"""

from __future__ import annotations

import contextvars
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from workers.persona.errors import PersonaConfigError, ToolSetupSlow
from workers.persona.tool_config import PythonDecl
from workers.persona.tools import Tool, ToolResult, bounded_timeout, is_tool_factory

__all__ = ["SETUP_TIMEOUT", "STALE_IMPORT", "PythonTool", "resolve_ref"]

#: Said by an error whose cause is a worker's older import of a tool module: a check in a
#: fresh process (the CLI's) passes, and only restarting the workers fixes it.
STALE_IMPORT = "a module is imported once per worker process"

#: Seconds a tool's module may take to import, and its factory to return, before the turn
#: fails (ToolSetupSlow naming the ref: transient, the retry finds a slow import done).
SETUP_TIMEOUT = 30.0


def resolve_ref(decl: PythonDecl, source: object) -> Tool:
    """Import ``decl.ref`` and return its Tool (PersonaConfigError naming the key if it fails)."""
    key = f"{decl.key}.ref"
    module_name, _, attribute = decl.ref.partition(":")
    try:
        value: Any = _import(module_name)
    except _Unfinished as late:
        raise ToolSetupSlow(source, key, str(late)) from None
    except Exception as exc:
        raise PersonaConfigError(
            source, key, f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise PersonaConfigError(
                source, key,
                f"{module_name!r} has no attribute {attribute!r}{_edited_since(module_name)}",
            )  # fmt: skip
        value = getattr(value, part)
    if not isinstance(value, Tool) and callable(value):
        if not is_tool_factory(value):
            raise PersonaConfigError(
                source,
                key,
                f"{decl.ref} is a callable not marked as a tool factory: name a Tool, or a "
                "function decorated with @workers.persona.tool_factory (only those are called: "
                "a persona file must not run any function the worker can import)",
            )
        factory = value
        try:
            value = _within(f"calling the factory {decl.ref}", factory)
        except _Unfinished as late:
            raise ToolSetupSlow(source, key, str(late)) from None
        except (Exception, SystemExit) as exc:
            raise PersonaConfigError(
                source, key, f"{decl.ref} raised {type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(value, Tool):
        raise PersonaConfigError(
            source,
            key,
            f"{decl.ref} is not a Tool (name, description, input_schema, execute) nor a "
            f"callable returning one; got {type(value).__name__}",
        )
    return value


class _Unfinished(Exception):
    """A tool's setup (its module's import, its factory) still running at its time limit."""


#: A setup's thread, its outcome box, and when its time is up (monotonic seconds).
_Setup = tuple[threading.Thread, list[tuple[bool, Any]], float]
#: Module imports under way on a setup thread, by module name: a turn finding one still running
#: waits for it instead of starting another thread that would only block on the module's import
#: lock (one leaked thread a turn for as long as the import hangs).
_IMPORTING: dict[str, _Setup] = {}
_IMPORTING_LOCK = threading.Lock()
#: When this process first imported each tool module (see :func:`_edited_since`).
_IMPORTED_AT: dict[str, float] = {}


def _start(work: Callable[[], Any]) -> _Setup:
    """``work()`` begun on a daemon thread, in a copy of this context (a turn's deadline, its
    bound log fields); its outcome lands in the returned box."""
    box: list[tuple[bool, Any]] = []
    context = contextvars.copy_context()

    def run() -> None:
        try:
            box.append((True, context.run(work)))
        except BaseException as exc:  # handed to the waiting thread as it was raised
            box.append((False, exc))

    thread = threading.Thread(target=run, name="tool-setup", daemon=True)
    thread.start()
    return thread, box, time.monotonic() + SETUP_TIMEOUT


def _wait(what: str, setup: _Setup) -> Any:
    """The outcome of ``setup``, waited for at most :data:`SETUP_TIMEOUT` (or what the turn
    has left): module code that blocks at import, or a factory that never returns, held the
    turn past its limit with its lease renewed, and hung the CLI's check. A stuck thread is
    left to finish on its own (a thread cannot be killed)."""
    thread, box, due = setup
    # Every caller shares the setup's one deadline: a module stuck at import cost each later
    # turn (and each dead lane `status` checks) another whole SETUP_TIMEOUT.
    thread.join(bounded_timeout(max(0.0, due - time.monotonic())))
    if not box:
        raise _Unfinished(
            f"{what} did not finish within {SETUP_TIMEOUT:g}s (a tool's module must import, "
            "and its factory return, promptly: it is set up at every turn)"
        )
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _within(what: str, work: Callable[[], Any]) -> Any:
    """``work()`` on a thread of its own, within the limit (:func:`_wait`)."""
    return _wait(what, _start(work))


def _edited_since(name: str) -> str:
    """A hint when the module's file changed after this process imported it: a worker
    imports a tool module once, so an attribute added since (which `soulfleet tools`, a
    fresh process, does find) is not there until the workers restart."""
    module = sys.modules.get(name)
    imported = _IMPORTED_AT.get(name)
    path = getattr(module, "__file__", None)
    if imported is None or not isinstance(path, str):
        return ""
    try:
        edited = os.stat(path).st_mtime
    except OSError:
        return ""
    if edited <= imported:
        return ""
    return (
        f" (this process imported {path} before it was last changed, "
        f"{time.strftime('%H:%M:%S', time.localtime(edited))}: {STALE_IMPORT}, so restart the "
        "workers to load the edit)"
    )


def _import(name: str) -> Any:
    """The module ``name``, imported within :data:`SETUP_TIMEOUT` (see :func:`_wait`)."""
    module = sys.modules.get(name)
    if module is not None and not getattr(module.__spec__, "_initializing", False):
        return module  # imported whole already: nothing can block (no thread needed)
    with _IMPORTING_LOCK:
        setup = _IMPORTING.get(name)
        if setup is None or not setup[0].is_alive():
            # Each attempt's start (an edit meanwhile is later); a failed import's time would
            # call the fixed module, imported since, "imported before it was changed".
            _IMPORTED_AT[name] = time.time()
            setup = _IMPORTING[name] = _start(lambda: importlib.import_module(name))
    return _wait(f"importing module {name!r}", setup)


class PythonTool:
    """A declared Python tool, bounded by a timeout (the byte caps are the toolbox's)."""

    source = "python"

    def __init__(self, inner: Tool, *, timeout: float) -> None:
        self._inner = inner
        self.timeout = timeout
        self.name = inner.name
        self.description = inner.description
        self.input_schema = inner.input_schema

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        box: list[ToolResult | BaseException] = []

        def work() -> None:
            try:
                box.append(self._inner.execute(arguments))
            except BaseException as exc:
                box.append(exc)

        timeout = bounded_timeout(self.timeout)
        thread = threading.Thread(target=work, name=f"tool-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if not box:
            why = (
                f"its {self.timeout:g}s timeout"
                if timeout >= self.timeout
                else f"the {timeout:g}s its turn had left"
            )
            return ToolResult(
                f"error: tool {self.name!r} did not finish within {why}", True, "timeout"
            )
        outcome = box[0]
        if isinstance(outcome, BaseException):
            raise outcome  # the loop turns it into an error result, as for any tool
        return outcome

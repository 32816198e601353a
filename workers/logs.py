"""Structured logging, configured once per process: console for people, JSON lines in production.

Every event goes to stderr through structlog, and so do Celery's and the libraries' stdlib logs
(via ``ProcessorFormatter``), so one JSON line format covers a whole worker. Each line carries:

- ``event``: a dotted name (``turn.start``, ``tick.emitted``, ``sweep.done`` …);
- ``level``, ``logger``;
- ``timestamp``: ISO-8601 UTC wall time, for people;
- ``ts``: seconds since the epoch from a wall-clock anchor taken once at process start plus
  ``time.monotonic()`` elapsed since — monotonic-safe: it never goes backwards within a process
  when NTP steps the wall clock, so intervals measured from ``turn.start``/``turn.end`` are real.

Context (``task_id``, ``lane``, ``turn_id``, ``fence``) is bound with structlog's contextvars;
:func:`bind_task` clears the previous task's context first, so a thread-pool worker never leaks
one turn's ids into the next turn's lines.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

from workers.persona.mcp_stderr import set_json_lines

__all__ = ["Throttle", "bind_task", "configure_logging", "monotonic_wall_time"]

_ANCHOR_WALL = time.time()
_ANCHOR_MONO = time.monotonic()
_configured: list[tuple[str, str]] = []  # the (format, level) this process is configured with


def monotonic_wall_time() -> float:
    """Wall-clock seconds that never go backwards within this process."""
    return _ANCHOR_WALL + (time.monotonic() - _ANCHOR_MONO)


def _add_ts(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event_dict.setdefault("ts", round(monotonic_wall_time(), 6))
    return event_dict


class _JsonLines:
    """structlog's final logger for JSON lines: one ``write`` of a whole line to the CURRENT
    ``sys.stderr`` (looked up per line, so a test's capture or a redirect is honoured).

    Why not stdlib logging for our own events: a line through ``logging`` + ``ProcessorFormatter``
    costs about three times one rendered here (a ``LogRecord``, the handler lock, a second
    processor chain), and a worker writes two or three per turn. One ``write`` call per line
    keeps lines whole beside the stdlib handler's writes to the same stream.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def msg(self, message: str) -> None:
        sys.stderr.write(message + "\n")

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def _json_lines(*args: Any) -> _JsonLines:
    return _JsonLines(str(args[0]) if args else "")


#: Celery's own INFO line for every task received and every task that succeeded: the turn
#: already logs ``turn.start`` and ``turn.end`` with the task id, lane and outcome, so these
#: would only double a worker's log volume (and its logging CPU). Their warnings and errors
#: (a task that raised unexpectedly, a lost worker) still come through; at debug level, all.
_PER_TASK = ("celery.worker.strategy", "celery.app.trace")


def configure_logging(fmt: str = "console", level: str = "INFO", *, force: bool = False) -> None:
    """Configure structlog and stdlib logging for this process (idempotent unless ``force``).

    JSON (production): structlog renders its own events straight to stderr; the libraries'
    stdlib records (Celery, kombu, httpx) get the same processors through
    ``ProcessorFormatter``, so every line has one shape. Console (people): everything goes
    through stdlib logging, rendered by structlog's console renderer.
    """
    if _configured == [(fmt, level)] and not force:
        return
    _configured[:] = [(fmt, level)]
    set_json_lines(fmt == "json")  # a stdio MCP server's stderr lines take the log's shape
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_ts,
    ]
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO

    if fmt == "json":
        structlog.configure(
            processors=[*shared, renderer],
            logger_factory=_json_lines,
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            cache_logger_on_first_use=True,
        )
    else:
        structlog.configure(
            processors=[
                *shared,
                structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
            ],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            cache_logger_on_first_use=True,
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(numeric)
    # Libraries that are chatty at INFO; their warnings still come through.
    for noisy in ("httpx", "httpcore", "kombu", "amqp"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    for per_task in _PER_TASK:  # back at SOULFLEET_LOG_LEVEL=debug
        logging.getLogger(per_task).setLevel(
            logging.DEBUG if numeric <= logging.DEBUG else max(numeric, logging.WARNING)
        )


def bind_task(**values: Any) -> None:
    """Start a task's log context: clear whatever the last task on this thread bound, then bind."""
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**{k: v for k, v in values.items() if v is not None})


class Throttle:
    """Whether to log a repeated warning about ``key`` now: the first time, then at most once
    per ``every`` seconds, with how many were held back since (a caller refused a thousand
    times in a loop gets a handful of lines, not a thousand, and still sees the count)."""

    #: Keys remembered at most; past it the oldest are forgotten (each logs once more).
    MAX_KEYS = 10_000

    def __init__(self, every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> int | None:
        """None: hold this one back. Else log it, saying how many were held back before it."""
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.every:
                self._seen[key] = (last[0], last[1] + 1)
                return None
            if last is None and len(self._seen) >= self.MAX_KEYS:
                del self._seen[next(iter(self._seen))]
            self._seen.pop(key, None)
            self._seen[key] = (now, 0)
            return 0 if last is None else last[1]

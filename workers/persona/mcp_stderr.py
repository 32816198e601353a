"""A stdio MCP server's stderr, relayed line by line to ours with the worker's secrets masked.

Why not hand the server our stderr descriptor, as the SDK would: a server that logs its
configuration, its environment or a rejected token (``env >&2`` in a wrapper script is enough)
wrote the API key it was given through ``${OPENAI_API_KEY}`` straight into the worker's log.
Here the server writes into a pipe; a daemon thread reads it, replaces every secret with
``***`` and writes each line to our stderr, prefixed with the server's name so an operator
knows whose complaint it is.

The secrets are the variables the server was given through ``${VAR}`` in its ``env`` and
``headers`` (the reason that syntax exists is to carry tokens; the transport names them), the
values of its own ``env`` entries whose names say they hold one (the fleet file's common shape
writes tokens literally), and
the values of the worker's own variables whose names say they hold one (``*KEY*``,
``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*PASS``) or that carry a password in a URL
(``REDIS_URL``: every form :func:`~workers.persona.urls.credential_forms` knows). Values shorter
than :data:`MIN_SECRET` are not masked: replacing every ``1`` or ``on`` would garble the lines
and protect nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TextIO

from workers.persona.urls import credential_forms

__all__ = [
    "BURST_LINES",
    "LAST_LINE_CHARS",
    "LINES_PER_SECOND",
    "MAX_LINE",
    "MIN_SECRET",
    "StderrRelay",
    "secrets_for",
    "set_json_lines",
]

#: The longest stderr line relayed (bytes); a longer one is dropped with a notice.
MAX_LINE = 64 * 1024
#: Lines a server may relay a second, on average, and at once: a server printing in a loop
#: filled the worker's log disk (190,000 lines in seconds). The lines over it are dropped and
#: counted in a notice.
LINES_PER_SECOND = 10.0
BURST_LINES = 200
#: The most of a server's last stderr line an error quotes.
LAST_LINE_CHARS = 300
#: The shortest value treated as a secret.
MIN_SECRET = 6
_json_lines = False


def set_json_lines(on: bool) -> None:
    """Relay each line as one JSON object (``mcp.stderr``), as the process logs
    (``SOULFLEET_LOG_FORMAT=json``: every line of the log one object), instead of plain text."""
    global _json_lines  # noqa: PLW0603
    _json_lines = on


_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASS$|CREDENTIAL", re.IGNORECASE)
_REDACTED = "***"


def secrets_for(
    names: Iterable[str],
    environ: Mapping[str, str] | None = None,
    given: Iterable[tuple[str, str]] = (),
) -> list[str]:
    """What to mask in the stderr of a server given the variables ``names`` (its ``${VAR}``
    references) and the ``env`` pairs ``given`` (as written: a value under a secret's name is
    one, as the fleet file's common shape writes tokens literally), longest first (a secret
    containing another is masked whole)."""
    env = os.environ if environ is None else environ
    found = {env.get(name, "") for name in names}
    for name, value in given:
        if _SECRET_NAME.search(name):
            found.add(value)
        if "://" in value:
            found.update(credential_forms(value))
    for name, value in env.items():
        if _SECRET_NAME.search(name):
            found.add(value)
        if "://" in value:
            found.update(credential_forms(value))
    return sorted((s for s in found if len(s) >= MIN_SECRET), key=len, reverse=True)


class StderrRelay:
    """A pipe whose write end a server gets as its stderr (:attr:`writer`), relayed to
    ``out`` by a daemon thread until every writer has closed it."""

    def __init__(self, name: str, secrets: Iterable[str], out: TextIO) -> None:
        self._name = name
        self._secrets = tuple(secrets)
        self._out = out
        read_fd, write_fd = os.pipe()
        self._reader = os.fdopen(read_fd, "rb")
        #: Give this to the child as its stderr; :meth:`close` drops our copy of it.
        self.writer: TextIO = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
        #: The last line relayed (masked, at most :data:`LAST_LINE_CHARS`): what a server that
        #: died at start said last, for the error that names it.
        self.last_line = ""
        self._json = _json_lines
        self._allowance = float(BURST_LINES)
        self._checked = time.monotonic()
        self._dropped = 0
        # The relay thread and the event loop (stdout noise, :meth:`stdout_line`) both write.
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._relay, name=f"mcp-stderr-{name}", daemon=True)
        self._thread.start()

    def _mask(self, line: str) -> str:
        for secret in self._secrets:
            line = line.replace(secret, _REDACTED)
        return line

    def _relay(self) -> None:
        with self._reader:
            while raw := self._reader.readline(MAX_LINE + 1):
                if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                    # Never held whole (a server printing without newlines would grow the
                    # worker's memory without bound), nor relayed in pieces (a secret cut at
                    # a piece's edge would not be masked): said, and skipped.
                    dropped = len(raw)
                    while raw and not raw.endswith(b"\n"):
                        raw = self._reader.readline(MAX_LINE + 1)
                        dropped += len(raw)
                    self._write(f"(a line of {dropped:,} bytes, over {MAX_LINE:,}, was dropped)")
                    continue
                line = self._mask(raw.decode("utf-8", errors="replace").rstrip("\n"))
                if line.strip():
                    self.last_line = line.strip()[:LAST_LINE_CHARS]
                with self._lock:
                    if self._allowed():
                        self._write(line)
            with self._lock:
                self._say_dropped()

    def stdout_line(self, line: str) -> None:
        """Say that the server wrote ``line`` on stdout, which is not JSON-RPC and was ignored
        (a banner or a log line: stdout carries the protocol), masked and rate-limited like its
        stderr. Never its last line: that is what it said on stderr, for its errors."""
        shown = self._mask(line.strip())[:LAST_LINE_CHARS]
        with self._lock:
            if self._allowed():
                self._write(
                    f"ignored a line on stdout that is not JSON-RPC (stdout carries the protocol: "
                    f"a server must log to stderr): {shown!r}"
                )

    def _allowed(self) -> bool:
        """Whether one more line may be relayed now (a token bucket of :data:`BURST_LINES`,
        refilled at :data:`LINES_PER_SECOND`); a line refused is counted for the notice."""
        now = time.monotonic()
        self._allowance = min(
            float(BURST_LINES), self._allowance + (now - self._checked) * LINES_PER_SECOND
        )
        self._checked = now
        if self._allowance < 1:
            self._dropped += 1
            return False
        self._allowance -= 1
        self._say_dropped()
        return True

    def _say_dropped(self) -> None:
        if self._dropped:
            dropped, self._dropped = self._dropped, 0
            self._write(
                f"({dropped:,} lines dropped: over {LINES_PER_SECOND:g} lines a second; the "
                "server's last line is kept for its errors)"
            )

    def _write(self, line: str) -> None:
        if self._json:
            text = json.dumps({
                "event": "mcp.stderr", "level": "info", "logger": "soulfleet.mcp",
                "server": self._name, "line": line,
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }, ensure_ascii=False)  # fmt: skip
        else:
            text = f"[mcp {self._name}] {line}"
        with contextlib.suppress(OSError, ValueError):
            self._out.write(text + "\n")
            self._out.flush()

    def close(self) -> None:
        """Drop our write end: the relay ends once the server's copy closes too (it exited)."""
        with contextlib.suppress(OSError):
            self.writer.close()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

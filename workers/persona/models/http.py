"""The one HTTP policy every provider client shares: timeout, retries, backoff, error mapping.

Why one hand-written policy on httpx rather than the official SDKs' built-in retry loops:

- One retry/backoff policy for every provider, configured once (``SOULFLEET_MODEL_TIMEOUT``,
  ``SOULFLEET_MODEL_RETRIES``), so the fleet's turn gate and lease renewal can reason about the
  worst case of a model call. Wrapping an SDK would mean either a retry loop inside ours (calls
  multiplied) or turning one of them off and depending on its internals.
- Failures land on our own :class:`~workers.persona.errors.ModelError` hierarchy with messages
  that name the provider, the HTTP status and a short excerpt of the provider's complaint, with
  every configured key scrubbed out: even a provider that echoes the key back cannot leak it.
- The sleep between tries goes through a :class:`~workers.persona.clock.Clock`, so tests observe
  the waits (``Retry-After`` honoured, backoff growing) without sleeping.

Retried: HTTP 429, 500, 502, 503, 504, 529, and connection failures and timeouts. A provider's
``x-should-retry: true|false`` header overrides that choice, as the official SDKs do. The wait is
``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date) when the provider sends one, else
exponential backoff with jitter; either way capped by :attr:`RetryPolicy.max_wait`. 401/403 and
other 4xx are not retried: asking again cannot fix a refused key or a malformed request.
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import re
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import httpx
import structlog

from workers.persona.clock import Clock, SystemClock
from workers.persona.errors import (
    ModelAuthError,
    ModelError,
    ModelRateLimited,
    ModelRequestError,
    ModelResponseError,
    ModelServerError,
    ModelSpecError,
    ModelTimeout,
    ModelUnreachable,
    TurnTimeUp,
)
from workers.persona.models.watchdog import WATCHDOG
from workers.persona.turn_time import time_left
from workers.persona.urls import is_http_url, split_credentials

__all__ = [
    "EXCERPT_CHARS",
    "KEEPALIVE_SECONDS",
    "MAX_ANSWER_BYTES",
    "READ_GRACE_MAX",
    "RETRY_STATUSES",
    "THREAD_LIMITS",
    "ProviderHTTP",
    "RetryPolicy",
    "check_base_url",
    "excerpt",
    "parse_retry_after",
    "redact_url",
    "scrub",
]

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 529})
#: Seconds an idle connection is kept: below the usual provider/load-balancer idle cut-off (60 s
#: and up), so the client retires a connection before the server hangs up on it.
KEEPALIVE_SECONDS = 30.0
#: One connection per calling thread, kept alive between its calls (see :class:`ProviderHTTP`).
THREAD_LIMITS = httpx.Limits(
    max_connections=1, max_keepalive_connections=1, keepalive_expiry=KEEPALIVE_SECONDS
)
EXCERPT_CHARS = 200
#: The most of one answer a call takes in (decoded): a model's answer is a few hundred KiB at
#: most, so anything larger is a proxy's page or a runaway stream, refused before it fills the
#: worker's memory (200 threads at once).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
#: Of an error answer only the start is read: its excerpt is all that is shown.
_ERROR_BODY_BYTES = 64 * 1024
#: How far past its deadline a try may still read an answer that has begun to arrive (its
#: headers are in): one finishing within it is kept, as it is paid for; a read still waiting
#: then is cut (watchdog.py). A quarter of the try's timeout, at most this many seconds.
READ_GRACE_MAX = 5.0
_REDACTED = "***"

log = structlog.get_logger("soulfleet.model")


#: A try the turn has less time left for than this is not made (it could only time out).
_SHORTEST_TRY = 0.5


def _tried(made: int, *, late: bool = False) -> str:
    """How the tries of a failed call ended, for its error message."""
    if late:
        return (
            f" (after {made} {'try' if made == 1 else 'tries'}; the turn's time limit, "
            "SOULFLEET_TURN_MAX_SECONDS, leaves no room for another)"
        )
    return f" (after {made} tries)" if made > 1 else ""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long one try may take, how many times to retry, and how long to wait in between.

    ``retries`` counts extra tries: 3 means up to 4 requests. ``max_wait`` caps any single wait,
    whether it comes from backoff or from the provider's ``Retry-After``.
    """

    timeout: float = 60.0
    retries: int = 3
    base_delay: float = 0.5
    max_wait: float = 60.0
    #: The longest wait a call sits out in place (holding its worker thread). A provider that
    #: asks for longer ends the call at once: the turn fails transiently, its lane says why
    #: (``sf status``), and its retry waits what was asked (:attr:`ModelError.retry_after`).
    hold_max: float = 10.0

    def backoff(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number ``retry`` (0-based) when the provider named none.

        "Equal jitter": half the exponential step is fixed, half random, so waits grow
        predictably yet a fleet that failed together does not retry in lockstep.
        """
        step = min(self.max_wait, self.base_delay * (2.0 ** min(retry, 32)))
        return step / 2 + rng.uniform(0.0, step / 2)


def parse_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the provider asked us to wait, or None when it did not say (or said nonsense).

    ``retry-after-ms`` (OpenAI's, more precise) wins over ``Retry-After``, which may be seconds
    or an HTTP date (compared with ``now``, epoch seconds).
    """
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        seconds = _non_negative(raw_ms)
        if seconds is not None:
            return seconds / 1000.0
    raw = (headers.get("retry-after") or "").strip()
    if not raw:
        return None
    seconds = _non_negative(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _non_negative(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, _REDACTED)
    return text


def excerpt(body: str, limit: int = EXCERPT_CHARS, *, secrets: Sequence[str] = ()) -> str:
    """A short, one-line summary of a provider's answer: its error message if it has one.

    Both providers wrap errors as ``{"error": {"message": ...}}`` (Anthropic adds a top-level
    ``type``); anything else is shown as its first characters. ``secrets`` are scrubbed
    before the cut: a key the cut split would no longer be found whole, and its first part
    would be shown.
    """
    text = body
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past the recursion limit
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
        elif isinstance(data.get("message"), str):
            text = data["message"]
    text = re.sub(r"\s+", " ", scrub(text, secrets)).strip()
    if not text:
        return "(empty body)"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def redact_url(url: str) -> str:
    """``url`` without credentials or query string, fit for an error message.

    The credentials are cut as a unit (:mod:`workers.persona.urls`): a password holding ``/``
    or ``@`` must not be half-parsed into the host.
    """
    parts = split_credentials(url)
    if not parts.scheme:
        return "<invalid URL>"
    rest = re.split(r"[?#]", parts.rest, maxsplit=1)[0]
    return f"{parts.scheme}://{rest}"


def check_base_url(url: str, *, provider: str, env: str) -> str:
    """The base URL without a trailing slash; ModelSpecError if it is not http(s)."""
    if not is_http_url(url):
        raise ModelSpecError(
            f"{provider}: base URL {redact_url(url)!r} is not an http(s) URL; check {env}"
        )
    return url.rstrip("/")


#: The most a provider's Retry-After may postpone a turn's retry (a date far off, a typo).
_LONGEST_RETRY_AFTER = 3600.0


@dataclass(frozen=True, slots=True)
class _Failure:
    """One failed try, kept until we know whether it was the last."""

    kind: type[ModelError]
    message: str
    retryable: bool
    wait: float | None = None


class ProviderHTTP:
    """POSTs JSON to one provider under the shared policy; returns the decoded JSON object.

    One model instance serves every concurrent turn of a worker (the fleet runs turns on pool
    threads), and each calling thread gets its own :class:`httpx.Client` holding one keep-alive
    connection (:data:`THREAD_LIMITS`), built on its first call and sharing one TLS context. So
    a worker keeps at most as many connections to a provider as it has pool threads, and a turn
    reuses its thread's connection instead of opening one. Why not one shared pool sized to the
    concurrency: httpcore's pool re-examines every connection (a ``poll`` each) on every
    request and response, which at 200 connections cost ~10 ms CPU per call and held a 2 s
    model to a third of the ideal rate on two cores; and at httpx's default limits (20 kept
    alive) it closed nearly every connection after use, which is both a new TCP/TLS handshake
    per turn and the path of a race that closes a socket under a thread still reading it
    ("Bad file descriptor", or a read that waits out the whole timeout on a connection the
    server never got a request on). A thread's private pool has no such sharing.
    """

    def __init__(
        self,
        *,
        provider: str,
        base_url: str,
        headers: Mapping[str, str],
        key_env: str,
        secrets: Sequence[str] = (),
        policy: RetryPolicy | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.provider = provider
        self.policy = policy or RetryPolicy()
        self._base_url = base_url.rstrip("/")
        self._key_env = key_env
        self._secrets = tuple(s for s in secrets if s)
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._headers = dict(headers)
        self._tls: ssl.SSLContext | None = None
        self._local = threading.local()
        # Weak: a client whose thread ended goes with it; close() reaches the live ones.
        self._clients: weakref.WeakSet[httpx.Client] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is not None and not client.is_closed:
            return client
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.provider}: the model client has been closed")
            if self._tls is None:
                self._tls = httpx.create_ssl_context()  # loading the CA bundle once, not per thread
            client = httpx.Client(
                headers=self._headers,
                timeout=httpx.Timeout(self.policy.timeout),
                limits=THREAD_LIMITS,
                verify=self._tls,
                # A redirected POST is rarely what a provider meant; report it instead (below).
                follow_redirects=False,
            )
            self._clients.add(client)
        self._local.client = client
        return client

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every thread's connection; the client cannot be used afterwards."""
        with self._lock:
            self._closed = True
            clients = list(self._clients)
        for client in clients:
            client.close()

    def excerpt(self, answer: str) -> str:
        """:func:`excerpt` of ``answer`` with this client's keys scrubbed before the cut."""
        return excerpt(answer, secrets=self._secrets)

    def error(self, kind: type[ModelError], detail: str) -> ModelError:
        """An error of ``kind`` whose message names the provider and holds no secret."""
        return kind(scrub(f"{self.provider}: {detail}", self._secrets))

    def post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``base_url + path``, retrying per the policy; the answer's JSON."""
        url = self._base_url + path
        try:
            content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise self.error(ModelRequestError, f"request is not valid JSON: {exc}") from None
        tries = self.policy.retries + 1
        failure: _Failure | None = None
        made = 0
        timed_out = False  # a try waited its full timeout
        for attempt in range(tries):
            if failure is not None:
                wait = failure.wait
                if wait is not None and wait > self.policy.hold_max:
                    raise self._long_wait(failure, wait)
                if wait is None:
                    wait = self.policy.backoff(attempt - 1, self._rng)
                wait = min(wait, self.policy.max_wait)
                left = time_left()  # inside a turn, no wait outlasts its limit (turn_time.py)
                if left is not None and wait >= left - _SHORTEST_TRY:
                    error = self.error(failure.kind, failure.message + _tried(made, late=True))
                    error.retry_after = failure.wait
                    raise error
                # A warning with what failed: at info, a fleet whose every call was refused
                # (a 429 storm) looked like slow calls until the breaker opened.
                log.warning(
                    "model.retry",
                    provider=self.provider,
                    attempt=attempt + 1,
                    tries=tries,
                    wait_s=round(wait, 3),
                    reason=failure.kind.__name__,
                    error=scrub(failure.message, self._secrets)[:300],
                )
                self._clock.sleep(wait)
            timeout = self.policy.timeout
            left = time_left()
            if left is not None:
                if left < _SHORTEST_TRY:
                    raise self.error(
                        TurnTimeUp,
                        "the turn's time limit (SOULFLEET_TURN_MAX_SECONDS) left "
                        f"{max(left, 0):.1f}s, too little for a call",
                    )
                timeout = min(timeout, left)
            timed_out = timed_out or (failure is not None and failure.kind is ModelTimeout)
            answer, failure = self._try(url, content, timeout)
            made += 1
            if answer is not None:
                return self._decode(*answer)
            assert failure is not None
            if timed_out and failure.kind is TurnTimeUp:
                # A full try timed out before this cut one: the provider is not answering, and
                # its breaker must hear of it (a hanging provider otherwise never opens it).
                failure = _Failure(ModelTimeout, failure.message, False)
            if not failure.retryable:
                break
        assert failure is not None
        if failure.retryable and failure.wait is not None and failure.wait > self.policy.hold_max:
            raise self._long_wait(failure, failure.wait)
        suffix = _tried(made) if failure.retryable else ""
        raise self.error(failure.kind, failure.message + suffix)

    def _long_wait(self, failure: _Failure, wait: float) -> ModelError:
        """The error of a call whose provider asked for a wait past :attr:`RetryPolicy.hold_max`:
        not waited out in place, so the worker's thread is free and the lane says why."""
        kept = min(wait, _LONGEST_RETRY_AFTER)
        after = "after it" if kept == wait else f"in {kept:.0f}s, the longest it waits"
        error = self.error(
            failure.kind,
            f"{failure.message}; the provider asked for {wait:.0f}s before the next try, longer "
            f"than a call waits in place ({self.policy.hold_max:g}s): the turn retries {after}",
        )
        error.retry_after = kept
        return error

    def _try(
        self, url: str, content: bytes, timeout: float
    ) -> tuple[tuple[httpx.Response, bytes] | None, _Failure | None]:
        where = redact_url(url)
        capped = timeout < self.policy.timeout
        # httpx's timeout bounds each phase (connect, send, one read): the whole try, body
        # included, is bounded here, so an answer trickling in a byte at a time cannot hold the
        # lane past the try's timeout or the turn's limit.
        deadline = time.monotonic() + timeout
        try:
            with self._client().stream(
                "POST",
                url,
                content=content,
                headers={"content-type": "application/json"},
                timeout=httpx.Timeout(timeout) if capped else httpx.USE_CLIENT_DEFAULT,
            ) as response:
                ok = 200 <= response.status_code < 300
                body = self._read(
                    response,
                    where,
                    deadline,
                    ok=ok,
                    cut_at=deadline + min(READ_GRACE_MAX, timeout / 4),
                )
        except (httpx.TransportError, httpx.DecodingError, httpx.InvalidURL) as exc:
            return None, self._transport_failure(exc, where, timeout, capped=capped)
        if body is None:
            why = "the answer still arriving"
            return None, self._timed_out(where, timeout, why, capped=capped)
        if isinstance(body, _Failure):
            return None, body
        if ok:
            return (response, body), None
        return None, self._status_failure(response, body, where)

    def _transport_failure(
        self, exc: Exception, where: str, timeout: float, *, capped: bool
    ) -> _Failure:
        """What a try that httpx could not complete failed of, rendered to text (scrubbed by
        error() later): the exception is never chained, its request carries our auth headers."""
        if isinstance(exc, httpx.TimeoutException):
            return self._timed_out(where, timeout, type(exc).__name__, capped=capped)
        if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
            return _Failure(ModelRequestError, f"bad URL {where}: {exc}", False)
        if isinstance(exc, httpx.ConnectError):
            return _Failure(ModelUnreachable, f"cannot connect to {where}: {exc}", True)
        if isinstance(exc, httpx.DecodingError):  # a body its content-encoding does not fit
            return _Failure(ModelResponseError, f"answer from {where} undecodable: {exc}", False)
        return _Failure(
            ModelUnreachable, f"connection to {where} failed: {type(exc).__name__}: {exc}", True
        )

    def _read(
        self, response: httpx.Response, where: str, deadline: float, *, ok: bool, cut_at: float
    ) -> bytes | _Failure | None:
        """The answer's body, decoded; a failure when it is over :data:`MAX_ANSWER_BYTES`;
        None when the try's deadline passed with more still to come (checked as each piece
        arrives; httpx bounds each read by the timeout, not the whole answer, so a read still
        waiting at ``cut_at`` is cut by the :data:`~workers.persona.models.watchdog.WATCHDOG`).
        Of an error answer, only its first :data:`_ERROR_BODY_BYTES`, and
        what had come by the deadline."""
        limit = MAX_ANSWER_BYTES if ok else _ERROR_BODY_BYTES
        declared = response.headers.get("content-length", "")
        if ok and declared.isdigit() and int(declared) > limit:
            return _Failure(
                ModelResponseError,
                f"answer over {limit:,} bytes (content-length {int(declared):,}) from {where}; "
                "not read",
                False,
            )
        chunks: list[bytes] = []
        size = 0
        with WATCHDOG.guard(_socket(response), cut_at) as guard:
            try:
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > limit:
                        if not ok:  # enough for the excerpt
                            chunks.append(chunk[: limit - size])
                            break
                        return _Failure(
                            ModelResponseError,
                            f"answer over {limit:,} bytes; not read further ({where})",
                            False,
                        )
                    chunks.append(chunk)
                    if time.monotonic() > deadline and not _complete(response, declared):
                        break
                else:
                    # An answer ending with its connection (no length, not chunked) reads a cut
                    # socket as its end: the watchdog's cut is not the answer's end.
                    if guard is None or not guard.fired:
                        return b"".join(chunks)
            except httpx.TransportError:
                if guard is None or not guard.fired:
                    raise
        # The deadline passed with more to come. An error's status is known: its excerpt is
        # what arrived. An answer still arriving is cut (one whose last bytes came in before
        # the deadline was kept above: it is paid for).
        return b"".join(chunks) if not ok else None

    def _timed_out(self, where: str, timeout: float, kind: str, *, capped: bool) -> _Failure:
        if capped:  # the turn's limit, not the provider's timeout: ends the turn, not retried
            return _Failure(
                TurnTimeUp,
                f"no answer from {where} within the {timeout:.1f}s the turn had left of "
                f"SOULFLEET_TURN_MAX_SECONDS ({kind})",
                False,
            )
        return _Failure(ModelTimeout, f"no answer from {where} within {timeout:g}s ({kind})", True)

    def _status_failure(self, response: httpx.Response, body: bytes, where: str) -> _Failure:
        status = response.status_code
        said = self.excerpt(_text(response, body))
        retryable = status in RETRY_STATUSES
        override = (response.headers.get("x-should-retry") or "").strip().lower()
        if override in ("true", "false"):
            retryable = override == "true"
        wait = parse_retry_after(response.headers, self._clock.time())
        kind: type[ModelError]
        if status in (401, 403):
            hint = f"check {self._key_env}" if self._secrets else f"{self._key_env} is not set"
            return _Failure(
                ModelAuthError, f"authentication refused (HTTP {status}): {said}; {hint}", False
            )
        if status == 429:
            kind, what = ModelRateLimited, "rate limited"
        elif status >= 500:
            kind, what = ModelServerError, "server error"
        elif 300 <= status < 400:
            target = redact_url(response.headers.get("location") or "?")
            return _Failure(
                ModelRequestError,
                f"HTTP {status} redirect from {where} to {target}; use the final URL as base URL",
                False,
            )
        else:
            kind, what = ModelRequestError, "request refused"
        return _Failure(kind, f"{what} (HTTP {status}): {said}", retryable, wait)

    def _decode(self, response: httpx.Response, body: bytes) -> dict[str, Any]:
        try:
            data = json.loads(body)
        except RecursionError:
            raise self.error(
                ModelResponseError,
                f"answer is nested too deeply to read (HTTP {response.status_code}, "
                f"{len(body)} bytes)",
            ) from None
        except (ValueError, UnicodeDecodeError):
            raise self.error(
                ModelResponseError,
                f"answer is not JSON (HTTP {response.status_code}): "
                f"{self.excerpt(_text(response, body))}",
            ) from None
        if not isinstance(data, dict):
            raise self.error(
                ModelResponseError,
                f"answer is JSON but not an object: {self.excerpt(_text(response, body))}",
            )
        return data


def _socket(response: httpx.Response) -> socket.socket | None:
    """The socket an HTTP/1.1 answer arrives on (httpcore's ``network_stream`` extension);
    None where the transport does not say (then only the checks between pieces bound it)."""
    stream = response.extensions.get("network_stream")
    sock = None if stream is None else stream.get_extra_info("socket")
    return sock if isinstance(sock, socket.socket) else None


def _complete(response: httpx.Response, declared: str) -> bool:
    """Whether every byte the answer announced (``content-length``) has come in."""
    return declared.isdigit() and response.num_bytes_downloaded >= int(declared)


def _text(response: httpx.Response, body: bytes) -> str:
    """``body`` as text, in the answer's declared charset (UTF-8 when none is, or unknown)."""
    try:
        return body.decode(response.encoding or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")

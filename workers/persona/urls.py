"""URL credentials, found and masked as a unit whatever characters the password holds.

``urllib.parse`` ends the authority at the first ``/``, ``?`` or ``#``, so in
``redis://:p@ss/w:rd@127.0.0.1:6390/0`` it finds the password ``p``, the host ``ss`` and a path
holding the rest of the secret; masking what it calls the password then leaks most of it and
replaces every ``p`` in the message. Here the credentials are everything between ``://`` and the
LAST ``@``: a host never contains ``@``, so this can only over-mask, never leak.

:func:`split_credentials` is the one parser; :func:`mask_credentials` the one masker (the
fleet's ``redact_url`` and the model clients' use it); :func:`ambiguous_credentials` tells a
settings reader that the URL will not parse the way its author meant (a raw ``/ ? #`` in the
password), so it can refuse it naming the variable instead of connecting somewhere else.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = [
    "Credentials",
    "ambiguous_credentials",
    "credential_forms",
    "is_http_url",
    "mask_credentials",
    "scrub",
    "split_credentials",
]

_PLAIN_USER = re.compile(r"[A-Za-z0-9._~-]*")
_SECRET_PARAM = re.compile(r"(?i)([?&](?:password|pass|pwd|token|key|secret)=)[^&#]*")
# Shorter "passwords" are not scrubbed from free text: replacing a one-letter secret would
# garble every message, and the URL itself is masked as a unit anyway.
_SCRUB_MIN = 4


@dataclass(frozen=True, slots=True)
class Credentials:
    """``scheme://userinfo@rest`` taken apart (``userinfo`` None when there is none)."""

    scheme: str
    userinfo: str | None
    rest: str

    @property
    def user(self) -> str:
        """The user name, only when it is a plain one: in ``p@ss/w:rd`` the part before the
        colon is a piece of a password, not a user, and must not be shown."""
        if self.userinfo is None:
            return ""
        user, colon, _ = self.userinfo.partition(":")
        return user if colon and _PLAIN_USER.fullmatch(user) else ""

    @property
    def password(self) -> str | None:
        """The raw (still percent-encoded) password: all of userinfo after the first colon, or
        the whole userinfo when it has no colon (Redis URLs put a lone password there)."""
        if self.userinfo is None:
            return None
        _, colon, password = self.userinfo.partition(":")
        return password if colon else self.userinfo


def split_credentials(url: str) -> Credentials:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return Credentials("", None, url)
    at = rest.rfind("@")
    if at < 0:
        return Credentials(scheme, None, rest)
    return Credentials(scheme, rest[:at], rest[at + 1 :])


def mask_credentials(url: str, *, keep_user: bool = True) -> str:
    """``url`` with its password (and any secret query parameter) replaced by ``***``."""
    parts = split_credentials(url)
    rest = _SECRET_PARAM.sub(r"\1***", parts.rest)
    if not parts.scheme:
        return rest
    if parts.userinfo is None:
        return f"{parts.scheme}://{rest}"
    user = parts.user if keep_user else ""
    masked = f"{user}:***" if (user or ":" in parts.userinfo) else "***"
    return f"{parts.scheme}://{masked}@{rest}"


def credential_forms(url: str) -> tuple[str, ...]:
    """Every form ``url``'s password can be echoed back in: as written, percent-decoded, and
    as the ``Basic`` credential an HTTP client sends for the userinfo (a proxy's error page may
    quote the header). Empty when the URL carries no password."""
    parts = split_credentials(url)
    password = parts.password
    if not password or parts.userinfo is None:
        return ()
    user, _, secret = parts.userinfo.partition(":")
    pair = f"{unquote(user)}:{unquote(secret)}"
    basic = base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return (password, unquote(password), basic)


def ambiguous_credentials(url: str) -> bool:
    """True when a raw ``/``, ``?`` or ``#`` in the credentials makes parsers disagree on where
    the host starts (they must be percent-encoded: %2F, %3F, %23)."""
    parts = split_credentials(url)
    return parts.userinfo is not None and any(ch in parts.userinfo for ch in "/?#")


def scrub(text: str, url: str | None) -> str:
    """``text`` with ``url``'s credentials masked wherever they appear: the URL as a unit, its
    raw userinfo, and the password raw and percent-decoded."""
    if not url:
        return text
    parts = split_credentials(url)
    text = text.replace(url, mask_credentials(url))
    if parts.userinfo:
        text = text.replace(f"{parts.userinfo}@", "***@")
    password = parts.password or ""
    for secret in {password, unquote(password)}:
        if len(secret) >= _SCRUB_MIN:
            text = text.replace(secret, "***")
    return text


def is_http_url(url: str) -> bool:
    """Whether ``url`` is http(s) with a host and, if it gives one, a valid port (a model
    provider's base URL must be: ``:abc`` failed every turn as a permanent error)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False

"""One Redis, two spellings: kombu's broker URL and redis-py's client URL.

kombu has no ``unix://`` transport (a worker given one dies at start with "No such transport:
unix"), and redis-py has no ``redis+socket://``. A Redis on a Unix socket is
``unix://[user:password@]/path?db=N`` to redis-py and ``redis+socket://[user:password@]/path
?virtual_host=N`` to kombu, which reads the database number from ``virtual_host`` (a ``db`` in
its query is overridden). Settings hold the broker URL in kombu's spelling
(:func:`kombu_url`); whatever talks to the broker's Redis with redis-py directly (the raw turn
publisher) converts it back (:func:`redis_py_url`). TCP URLs are the same to both and pass
through unchanged.
"""

from __future__ import annotations

from workers.persona.urls import split_credentials

__all__ = ["kombu_url", "redis_py_url"]

_KOMBU_SOCKET = "redis+socket"


def kombu_url(url: str) -> str:
    """``url`` as kombu's Redis transport takes it (``unix://`` becomes ``redis+socket://``)."""
    return _respell(url, "unix", _KOMBU_SOCKET, "db", "virtual_host")


def redis_py_url(url: str) -> str:
    """``url`` as redis-py takes it (``redis+socket://`` becomes ``unix://``)."""
    return _respell(url, _KOMBU_SOCKET, "unix", "virtual_host", "db")


def _respell(url: str, scheme: str, into: str, key: str, key_into: str) -> str:
    parts = split_credentials(url)
    if parts.scheme != scheme:
        return url
    path, _, query = parts.rest.partition("?")
    params = [
        f"{key_into if name == key else name}{eq}{value}"
        for name, eq, value in (pair.partition("=") for pair in query.split("&") if pair)
    ]
    userinfo = "" if parts.userinfo is None else f"{parts.userinfo}@"
    tail = f"?{'&'.join(params)}" if params else ""
    return f"{into}://{userinfo}{path}{tail}"

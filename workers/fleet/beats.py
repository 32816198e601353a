"""The surfaced-beats feed, read side: what personas said when a heartbeat had something to say.

The write happens inside ``finish.lua`` (``XADD beats MAXLEN ~ SOULFLEET_BEATS_MAX``), in the
same atomic step that commits the turn, so a beat is in the stream iff its turn committed; a
``HEARTBEAT_OK`` reply never gets there. A Redis stream rather than a list because readers
want both "the last 100" (:meth:`Beats.recent`, XREVRANGE) and "tell me as they come"
(:meth:`Beats.follow`, blocking XREAD from an id), and the stream trims itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import cast

import redis

from workers.fleet.keys import Keys
from workers.fleet.scripts import redis_errors

__all__ = ["Beat", "Beats"]

# What redis-py returns for stream reads on a decode_responses client (its stubs are looser).
_Entries = list[tuple[str, dict[str, str]]]


@dataclass(frozen=True, slots=True)
class Beat:
    """One surfaced heartbeat reply. ``time`` is epoch seconds; ``id`` the stream entry id."""

    persona: str
    text: str
    turn_id: str
    time: float
    id: str

    @classmethod
    def from_entry(cls, entry_id: str, fields: Mapping[str, str]) -> Beat:
        try:
            when = float(fields.get("time", "0"))
        except ValueError:
            when = 0.0
        return cls(
            persona=fields.get("persona", ""),
            text=fields.get("text", ""),
            turn_id=fields.get("turn_id", ""),
            time=when,
            id=entry_id,
        )


class Beats:
    """Reads the fleet's beats stream. Needs a client made with ``decode_responses=True``."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def recent(self, count: int = 100) -> list[Beat]:
        """The newest ``count`` beats, oldest first (newest LAST)."""
        if count <= 0:
            return []
        with redis_errors(self.client):
            entries = cast(_Entries, self.client.xrevrange(self.keys.beats, count=count))
        return [Beat.from_entry(entry_id, fields) for entry_id, fields in reversed(entries)]

    def last_id(self) -> str:
        """The id of the newest beat, or ``0-0`` when the stream is empty."""
        with redis_errors(self.client):
            newest = cast(_Entries, self.client.xrevrange(self.keys.beats, count=1))
        return str(newest[0][0]) if newest else "0-0"

    def follow(
        self,
        last_id: str = "$",
        *,
        block_ms: int = 5000,
        stop: threading.Event | None = None,
    ) -> Iterator[Beat]:
        """Yield beats newer than ``last_id`` as they arrive (``$``: only beats added after
        this call), forever or until ``stop`` is set (checked every ``block_ms``).

        The client's socket timeout must exceed ``block_ms``.
        """
        # Resolve "$" now, not at the first next(): re-sending "$" on every XREAD, or resolving
        # it lazily, would skip beats added in between.
        cursor = self.last_id() if last_id == "$" else last_id
        return self._follow(cursor, block_ms, stop)

    def _follow(self, cursor: str, block_ms: int, stop: threading.Event | None) -> Iterator[Beat]:
        while stop is None or not stop.is_set():
            with redis_errors(self.client):
                batches = cast(
                    list[tuple[str, _Entries]],
                    self.client.xread({self.keys.beats: cursor}, count=100, block=block_ms),
                )
            for _stream, entries in batches or []:
                for entry_id, fields in entries:
                    cursor = entry_id
                    yield Beat.from_entry(entry_id, fields)

"""Each lane directory's listing of conversation files, cached per process, and the thread that
unlinks pruned files off the turn's path.

Why a cache: a lane holds up to ``max_conversations`` files and every turn needs its listing
twice (to resume a conversation, to prune the oldest): listing and parsing 1,000 names made a
lane's 1,000th turn cost twice its first. Why a reaper: freeing a pruned file's blocks cost the
pruning turn 1-2.5 ms (:mod:`workers.persona.reaper`). The two meet here because a file queued
for unlinking must already be out of every listing, and a finished unlink moves the cached
listing's version past our own change.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable

from workers.persona.reaper import Reaper
from workers.persona.transcript_layout import SUFFIX, parse_file_name

__all__ = ["LISTINGS", "REAPER", "Listing", "Listings", "reaped", "wait_pruned"]


class Listing:
    """One lane directory's ``*.jsonl`` files: by name, by conversation id, and oldest first."""

    def __init__(self, lane: str, paths: dict[str, str]) -> None:
        self.lane = lane
        self.paths = paths
        self.ids: dict[str, str] = {}
        self.order: list[str] = sorted(name for name in paths if self._index(name))

    def _index(self, name: str) -> bool:
        info = parse_file_name(self.lane, name)
        if info is None:
            return False
        self.ids[info.id] = name
        return True

    def add(self, name: str, path: str) -> None:
        self.paths[name] = path
        if self._index(name):
            # A new conversation is normally the newest: appending keeps the order sorted.
            if self.order and name < self.order[-1]:
                bisect.insort(self.order, name)
            else:
                self.order.append(name)

    def remove(self, name: str) -> None:
        self.paths.pop(name, None)
        info = parse_file_name(self.lane, name)
        if info is not None and self.ids.get(info.id) == name:
            del self.ids[info.id]
            index = bisect.bisect_left(self.order, name)
            if index < len(self.order) and self.order[index] == name:
                del self.order[index]


class Listings:
    """Lane directory listings shared by every store of the process, keyed by directory mtime.

    A lane holds up to ``max_conversations`` files and every turn needs its listing twice (to
    resume a conversation, to prune the oldest): listing and parsing 1,000 names made a lane's
    1,000th turn cost twice its first. A listing (indexed by id, kept oldest first) is reused
    while the directory's ``(st_mtime_ns, st_ino)`` is what it was when we listed it or last
    changed it ourselves, so any other writer's change (another process, a person) is seen on
    the next turn. The one blind spot: directory times are as coarse as the kernel's clock tick
    (1-4 ms), so a foreign change in the same tick as one of ours goes unseen until the
    directory changes again. Only the lane's one running turn writes there, so the worst case
    is a file pruned a turn late.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int], Listing]] = {}

    @staticmethod
    def _version(directory: str) -> tuple[int, int] | None:
        try:
            st = os.stat(directory)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_mtime_ns, st.st_ino)

    def listing(self, directory: str, lane: str) -> Listing | None:
        """The lane's listing (shared: read it under :meth:`locked`), None if it has no dir."""
        version = self._version(directory)
        if version is None:
            with self._lock:
                self._cache.pop(directory, None)
            return None
        with self._lock:
            cached = self._cache.get(directory)
            if cached is not None and cached[0] == version:
                return cached[1]
        try:
            with os.scandir(directory) as entries:
                found = {
                    e.name: e.path
                    for e in entries
                    if e.name.endswith(SUFFIX)
                    and e.path not in REAPER  # pruned, its unlink still queued
                    and e.is_file(follow_symlinks=False)
                }
        except (FileNotFoundError, NotADirectoryError):
            return None
        listing = Listing(lane, found)
        with self._lock:
            if len(self._cache) >= LISTINGS_MAX and directory not in self._cache:
                self._cache.pop(next(iter(self._cache)))
            self._cache[directory] = (version, listing)
        return listing

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def _changed(self, directory: str, change: Callable[[Listing], object]) -> None:
        with self._lock:
            cached = self._cache.get(directory)
            if cached is None:
                return
            change(cached[1])
            version = self._version(directory)
            if version is None:
                self._cache.pop(directory, None)
            else:
                self._cache[directory] = (version, cached[1])

    def forget(self, directory: str) -> None:
        """Drop a listing we can no longer vouch for: the next use lists the directory."""
        with self._lock:
            self._cache.pop(directory, None)

    def added(self, directory: str, name: str, path: str) -> None:
        self._changed(directory, lambda listing: listing.add(name, path))

    def removed(self, directory: str, name: str) -> None:
        self._changed(directory, lambda listing: listing.remove(name))


LISTINGS_MAX = 4096
LISTINGS = Listings()


def reaped(path: str, ok: bool) -> None:
    directory, name = os.path.split(path)
    if ok:
        # Our own change to the directory: move the listing's version past it (the file left
        # the listing when it was queued), so the next turn does not list the lane again.
        LISTINGS.removed(directory, name)
    else:
        LISTINGS.forget(directory)  # still on disk: count it again


REAPER = Reaper("soulfleet-transcript-pruner", on_done=reaped)


def wait_pruned(timeout: float | None = None) -> bool:
    """Block until every pruned file this process queued is off the disk (tests, shutdown);
    False if ``timeout`` ran out first."""
    return REAPER.wait(timeout)

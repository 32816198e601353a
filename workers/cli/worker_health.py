"""Whether any worker consumes the queues lanes wait in, for ``status``.

With every worker gone, ``status`` showed lanes ``queued`` and nothing else: only the metrics
(``up``) and the NoWorkers alert said why. Asking costs a remote-control round trip (up to a
second), so it is asked only when a lane has waited longer than a worker would leave it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from workers.cli.health import lanes_of
from workers.queues import KINDS

__all__ = ["QUEUED_TOO_LONG", "unserved_kinds"]

#: A lane queued this long (seconds) makes ``status`` ask whether its queue has a consumer.
QUEUED_TOO_LONG = 30.0


def unserved_kinds(
    entries: Iterable[Mapping[str, Any]],
    consumers: Callable[[], Mapping[str, list[str]]],
    *,
    now: float | None = None,
) -> dict[str, int]:
    """Turn kinds whose queue no worker answered for, each with how many lanes have waited
    there longer than :data:`QUEUED_TOO_LONG`. ``consumers`` (each kind's consuming workers,
    :meth:`~workers.publisher.CeleryPublisher.consumers_by_kind`) is asked only when a lane
    waited that long."""
    at = time.time() if now is None else now
    waiting: dict[str, int] = {}
    for entry in entries:
        for _, lane, _ in lanes_of(entry):
            queued_at = lane.get("queued_at")
            kind = str(lane.get("kind") or "")
            if (
                lane.get("state") == "queued"
                and kind in KINDS
                and isinstance(queued_at, float)
                and at - queued_at > QUEUED_TOO_LONG
            ):
                waiting[kind] = waiting.get(kind, 0) + 1
    if not waiting:
        return {}
    served = consumers()
    return {kind: n for kind, n in sorted(waiting.items()) if not served.get(kind)}

"""The fleet wing: everything that coordinates personas through Redis.

Lanes and their Lua scripts, leases and the renewer, the turn gate, the registry of persona
names, the surfaced-beats stream, the key names, the errors, and the host API
(:class:`Fleet`). Nothing here imports Celery: a :class:`Fleet` is handed its
:class:`Publisher` by whoever builds it (:func:`workers.publisher.connect` for Celery).
"""

from __future__ import annotations

from workers.fleet.host import Fleet, Publisher
from workers.fleet.outcomes import RunReply

__all__ = ["Fleet", "Publisher", "RunReply"]

"""beat: the fleet's clock — registry sync, the due-set sweep, dream batches and the reaper.

The scheduler side of soulfleet (``celery -A workers beat`` runs :class:`beat.scheduler.
FleetScheduler`). Arrows run one way: beat imports ``workers``; nothing in ``workers`` imports
beat. Importing this package imports nothing: pick the module you need.
"""

from __future__ import annotations

__all__: list[str] = []

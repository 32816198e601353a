"""The fleet's door settings as beat records them, and as a CLI process takes them over.

A shell running ``soulfleet post`` or ``status`` reads its own environment, which need not be
the fleet's: without the fleet's SOULFLEET_DAILY_TOKENS it showed no budget (or one the fleet
does not have), and with a larger SOULFLEET_INBOX_MAX than the fleet's it filled an inbox past
the fleet's limit. beat records what its processes read (:attr:`Keys.registry_settings`, each
registry sync) and the CLI's fleet applies it (:func:`with_fleet_settings`). Models are not
taken over for checks: a command checks a persona's model with its own configuration (a
scripted path or a key the workers' machine has would refuse posts). They are for reports:
``status`` names the model each kind of turn uses from the fleet's defaults
(:func:`fleet_models`), where a shell's own SOULFLEET_MODEL named one the fleet never calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from workers.settings import Settings

__all__ = [
    "ModelDefaults",
    "fleet_lock_mode",
    "fleet_models",
    "fleet_settings_record",
    "with_fleet_settings",
]


@dataclass(frozen=True, slots=True)
class ModelDefaults:
    """The fleet's model defaults: SOULFLEET_MODEL (``default``, what ``inherit`` means), and
    SOULFLEET_HEARTBEAT_MODEL / SOULFLEET_DREAM_MODEL (``""``: the persona's own model)."""

    default: str
    heartbeat: str = ""
    dream: str = ""

    @classmethod
    def of(cls, settings: Settings) -> ModelDefaults:
        default = settings.model.default_spec or "scripted:builtin"
        return cls(default, settings.heartbeat_model, settings.dream_model)


def fleet_settings_record(settings: Settings) -> str:
    """What beat records (:attr:`Keys.registry_settings`): its daily budget and inbox limits,
    its model defaults and its lock mode."""
    models = ModelDefaults.of(settings)
    return json.dumps(
        {
            "daily_tokens": settings.daily_tokens,
            "inbox_max": settings.inbox_max,
            "item_max_bytes": settings.item_max_bytes,
            "models": {"default": models.default, "heartbeat": models.heartbeat,
                       "dream": models.dream},
            "lock_mode": settings.lock_mode,
        }
    )  # fmt: skip


def fleet_lock_mode(raw: str | None) -> str | None:
    """The SOULFLEET_LOCK_MODE beat recorded (``raw``); None when the record has none."""
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    mode = record.get("lock_mode") if isinstance(record, dict) else None
    return mode if mode in ("local", "shared") else None


def fleet_models(raw: str | None) -> ModelDefaults | None:
    """The model defaults beat recorded (``raw``, :func:`fleet_settings_record`); None when the
    record holds none (an older beat) or none readable."""
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    models = record.get("models") if isinstance(record, dict) else None
    if not isinstance(models, dict):
        return None
    default, heartbeat, dream = (models.get(k) for k in ("default", "heartbeat", "dream"))
    if not (isinstance(default, str) and default):
        return None
    return ModelDefaults(
        default,
        heartbeat if isinstance(heartbeat, str) else "",
        dream if isinstance(dream, str) else "",
    )


def _count(value: Any, *, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def with_fleet_settings(settings: Settings, raw: str | None) -> Settings:
    """``settings`` with what beat recorded (``raw``, :func:`fleet_settings_record`) in place
    of this process's own; each field taken only when present and valid (a record from an
    older beat holds only the budget), ``settings`` as they are when nothing readable was."""
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return settings
    if not isinstance(record, dict):
        return settings
    changes: dict[str, Any] = {}
    if "daily_tokens" in record:
        daily = record["daily_tokens"]
        if daily is None or _count(daily, least=0):
            changes["daily_tokens"] = daily
    for name in ("inbox_max", "item_max_bytes"):
        if _count(record.get(name), least=1):
            changes[name] = record[name]
    return replace(settings, **changes) if changes else settings

"""The last check before a turn pays (is there a budget left, anything new to dream about, is a
heartbeat still inside its active hours?), and what a persona's spend settings resolve to (its
model per kind of turn, its effective budget).

beat's sweep skips most unaffordable or pointless ticks before they become turns; this guard
catches the rest at turn start, before the model is called: turns queued before the budget ran
out, follow-ups finish queued, a dream follow-up after a pass that already read everything.
The rules themselves are the core's (:mod:`workers.persona.spend`); this module only reads the
Redis numbers they need (today's tokens from the :class:`~workers.fleet.usage.UsageLedger`,
the dreamer lane's last pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

from workers.fleet.door_settings import ModelDefaults
from workers.fleet.scripts import redis_errors
from workers.fleet.usage import UsageLedger
from workers.persona.agent import AgentDef
from workers.persona.definitions import definitions
from workers.persona.errors import PersonaError
from workers.persona.manifest import PersonaConfig
from workers.persona.spend import (
    DailyBudget,
    budget_refuses,
    effective_budget,
    model_for_kind,
    nothing_new,
    pass_field,
)
from workers.settings import Settings

__all__ = [
    "LAST_PASS",
    "Refusal",
    "SpendGuard",
    "kind_model",
    "next_reset",
    "persona_budget",
    "persona_models",
]

#: Lane-hash field: ms when the dreamer lane's newest pass that called its model ended.
LAST_PASS = "last_pass"  # noqa: S105 (a field name, not a password)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a turn ends without a model call. ``skipped``: background work nobody waits for;
    ``refused``: a conversation turned away (its senders get ``detail`` as the reply)."""

    reason: Literal["budget", "nothing_new", "quiet_hours", "nothing_to_answer"]
    status: Literal["skipped", "refused"]
    detail: str


def next_reset(budget: DailyBudget, now: float) -> str:
    """When the budget's day ends, as an ISO time in its zone (for people reading a refusal)."""
    zone = ZoneInfo(budget.timezone)
    local = datetime.fromtimestamp(now, zone)
    midnight = (local + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight.isoformat(timespec="minutes")


def _config(home: Path) -> PersonaConfig | None:
    """The persona's parsed persona.toml (None when unreadable or invalid), from the process's
    cache while the file is unchanged: Fleet.post reads the budget on every post."""
    try:
        return definitions.load(home)[1]
    except PersonaError:
        return None


def persona_budget(home: Path, settings: Settings) -> DailyBudget:
    """The persona's effective budget, read from its persona.toml; an unreadable or invalid
    file means the fleet default (the registry reports the file's problem elsewhere)."""
    config = _config(home)
    return effective_budget(None if config is None else config.budget, settings.daily_tokens)


def persona_models(home: Path, defaults: ModelDefaults) -> dict[str, str]:
    """The model spec each kind of turn of the persona uses ({} if persona.toml is invalid),
    with the fleet's ``defaults``; ``inherit`` is shown as what it inherits."""
    config = _config(home)
    if config is None:
        return {}
    models = {}
    for kind, label in (("interactive", "conversation"), ("heartbeat", "heartbeat"),
                        ("dream", "dream")):  # fmt: skip
        spec = kind_model(config, kind, defaults)
        models[label] = defaults.default if spec == "inherit" else spec
    return models


def kind_model(
    persona: AgentDef | PersonaConfig, kind: str, defaults: Settings | ModelDefaults
) -> str:
    """The model spec a turn of ``kind`` pays for (:func:`model_for_kind` with the fleet's
    per-kind defaults, from its settings or as beat recorded them); may be ``inherit`` (the
    fleet's SOULFLEET_MODEL)."""
    fleet = ModelDefaults.of(defaults) if isinstance(defaults, Settings) else defaults
    return model_for_kind(
        kind,
        persona_model=persona.model,
        heartbeat_model=persona.heartbeat.model if persona.heartbeat else None,
        dream_model=persona.dream.model if persona.dream else None,
        fleet_heartbeat_model=fleet.heartbeat,
        fleet_dream_model=fleet.dream,
    )


#: Seconds a heartbeat turn may start outside its active hours and still run: beat decides on
#: Redis's clock, a worker on its host's, and a turn ticked as the window closed starts a moment
#: after it.
QUIET_GRACE = 60.0


class SpendGuard:
    """Decides, at turn start, whether a turn may call its model. Thread-safe."""

    def __init__(self, ledger: UsageLedger, *, fleet_daily_tokens: int | None) -> None:
        self.ledger = ledger
        self.client = ledger.client
        self.keys = ledger.keys
        self.fleet_daily_tokens = fleet_daily_tokens

    def budget(self, persona: AgentDef) -> DailyBudget:
        return effective_budget(persona.budget, self.fleet_daily_tokens)

    def day(self, persona: AgentDef) -> str:
        """The persona's usage day now (its budget's time zone)."""
        return self.ledger.today(self.budget(persona).timezone)

    def check(
        self,
        persona: AgentDef,
        kind: str,
        *,
        last_pass: float | None,
        last_pass_began: float | None = None,
    ) -> Refusal | None:
        """A refusal for a turn of ``kind``, or None when it may call the model.

        ``last_pass`` / ``last_pass_began`` (epoch s, None: never): when the dreamer lane's
        newest pass that called its model ended / began (the lane's ``LAST_PASS`` field, which
        a worker's turn start returns)."""
        hours = persona.heartbeat.active_hours if persona.heartbeat else None
        now = self.ledger.clock.time()
        if (
            kind == "heartbeat"
            and hours is not None
            and not any(hours.contains(now + shift) for shift in (-QUIET_GRACE, 0.0, QUIET_GRACE))
        ):
            # beat checked when it ticked; a turn queued behind a backlog, a deferral or an
            # edit of active_hours may start after the window closed (a post turns the turn
            # into a conversation at start, which always runs).
            return Refusal("quiet_hours", "skipped", "outside the persona's heartbeat.active_hours")
        budget = self.budget(persona)
        if budget.daily_tokens is not None:
            spent = self.ledger.spent(persona.name, self.ledger.today(budget.timezone))
            if budget_refuses(budget, kind, spent):
                reset = next_reset(budget, self.ledger.clock.time())
                detail = (
                    f"daily token budget used up ({spent} of {budget.daily_tokens} tokens "
                    f"today, on_exceed={budget.on_exceed}); it resets at {reset}"
                )
                status: Literal["skipped", "refused"] = (
                    "skipped" if kind in ("heartbeat", "dream") else "refused"
                )
                return Refusal("budget", status, detail)
        if kind == "dream" and nothing_new(persona.home, persona.name, last_pass, last_pass_began):
            return Refusal(
                "nothing_new",
                "skipped",
                "no conversation was added and no note written since the persona's last dream pass",
            )
        return None

    def passed(self, lane: str, ended: float, began: float) -> None:
        """Record that a dream pass ran from ``began`` to ``ended``
        (:func:`~workers.persona.spend.pass_field`): a conversation written after ``began`` is
        new to the next pass (this one could not read it), its own writes before ``ended`` are
        not. After the commit, on purpose: a crash in between only means the next pass runs
        although nothing new came (never the reverse). Skipped passes do not move it, so what
        they did not read still counts as new."""
        with redis_errors(self.client):
            self.client.hset(self.keys.lane(lane), LAST_PASS, pass_field(ended, began))

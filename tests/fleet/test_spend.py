"""The fleet's daily budget as beat records it, and as a CLI process takes it over."""

from __future__ import annotations

from workers.fleet.spend import spend_record, with_fleet_spend
from workers.settings import Settings


def test_the_recorded_budget_replaces_the_shells_and_nothing_else() -> None:
    """A fleet's SOULFLEET_DAILY_TOKENS (or its absence) wins over the shell's; the model is
    never taken over; a record that is missing, unreadable or of another shape changes
    nothing."""
    fleet = Settings.from_env({"SOULFLEET_DAILY_TOKENS": "100"})
    shell = Settings.from_env({"SOULFLEET_DAILY_TOKENS": "50"})
    assert with_fleet_spend(shell, spend_record(fleet)).daily_tokens == 100
    assert with_fleet_spend(shell, spend_record(Settings.from_env({}))).daily_tokens is None
    assert with_fleet_spend(shell, spend_record(fleet)).model == shell.model
    for raw in (None, "", "not json", "[]", "{}", '{"daily_tokens": 1.5}',
                '{"daily_tokens": true}', '{"daily_tokens": -1}'):  # fmt: skip
        assert with_fleet_spend(shell, raw) is shell

"""The fleet's door settings as beat records them, and as a CLI process takes them over."""

from __future__ import annotations

from workers.fleet.door_settings import (
    ModelDefaults,
    fleet_models,
    fleet_settings_record,
    with_fleet_settings,
)
from workers.settings import Settings


def test_the_recorded_budget_and_inbox_limits_replace_the_shells_and_nothing_else() -> None:
    """A fleet's SOULFLEET_DAILY_TOKENS (or its absence), SOULFLEET_INBOX_MAX and
    SOULFLEET_ITEM_MAX_BYTES win over the shell's (a shell with a larger inbox limit filled an
    inbox past the fleet's); the model is never taken over; a record that is missing,
    unreadable or of another shape changes nothing, and an older beat's budget-only record
    changes only the budget."""
    fleet = Settings.from_env(
        {
            "SOULFLEET_DAILY_TOKENS": "100",
            "SOULFLEET_INBOX_MAX": "7",
            "SOULFLEET_ITEM_MAX_BYTES": "900",
        }
    )
    shell = Settings.from_env({"SOULFLEET_DAILY_TOKENS": "50", "SOULFLEET_INBOX_MAX": "5000"})
    taken = with_fleet_settings(shell, fleet_settings_record(fleet))
    assert (taken.daily_tokens, taken.inbox_max, taken.item_max_bytes) == (100, 7, 900)
    assert taken.model == shell.model
    assert (
        with_fleet_settings(shell, fleet_settings_record(Settings.from_env({}))).daily_tokens
        is None
    )
    older = with_fleet_settings(shell, '{"daily_tokens": 10}')
    assert (older.daily_tokens, older.inbox_max) == (10, 5000)
    for raw in (None, "", "not json", "[]", "{}", '{"daily_tokens": 1.5}',
                '{"daily_tokens": true}', '{"daily_tokens": -1}', '{"inbox_max": 0}',
                '{"inbox_max": "9"}'):  # fmt: skip
        assert with_fleet_settings(shell, raw) is shell


def test_the_recorded_model_defaults_are_read_back_and_a_bad_record_gives_none() -> None:
    """The record carries SOULFLEET_MODEL (scripted:builtin when unset),
    SOULFLEET_HEARTBEAT_MODEL and SOULFLEET_DREAM_MODEL; an older beat's record, or one of
    another shape, gives None (the shell's own are shown then)."""
    fleet = Settings.from_env({"SOULFLEET_DREAM_MODEL": "scripted:dream.toml"}, model_reach=False)
    assert fleet_models(fleet_settings_record(fleet)) == ModelDefaults(
        "scripted:builtin", "", "scripted:dream.toml"
    )
    for raw in (None, "", "not json", "[]", '{"daily_tokens": 10}', '{"models": []}',
                '{"models": {"default": ""}}', '{"models": {"default": 3}}'):  # fmt: skip
        assert fleet_models(raw) is None
    assert fleet_models('{"models": {"default": "openai:x", "heartbeat": 4}}') == ModelDefaults(
        "openai:x"
    )

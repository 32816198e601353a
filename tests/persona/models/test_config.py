"""ModelConfig.from_env: SDK-compatible variable names, stripped values, loud bad numbers."""

from __future__ import annotations

import pytest

from workers.persona.errors import SettingsError
from workers.persona.models.config import ModelConfig, Secret


def test_empty_environment_means_the_defaults() -> None:
    """No variables (or blank ones) give the dataclass defaults."""
    assert ModelConfig.from_env({}) == ModelConfig()
    assert ModelConfig.from_env({"OPENAI_BASE_URL": "  ", "SOULFLEET_MODEL": ""}) == ModelConfig()


def test_values_are_read_and_stripped() -> None:
    """Every variable lands in its field, with surrounding white space removed."""
    config = ModelConfig.from_env(
        {
            "SOULFLEET_MODEL": " openai:gpt-4o-mini ",
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1\n",
            "OPENAI_API_KEY": " sk-test ",
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:8",
            "ANTHROPIC_API_KEY": "ak-test",
            "SOULFLEET_MODEL_TIMEOUT": "2.5",
            "SOULFLEET_MODEL_RETRIES": "0",
            "SOULFLEET_MODEL_MAX_OUTPUT_TOKENS": "100",
        }
    )
    assert config == ModelConfig(
        default_spec="openai:gpt-4o-mini",
        openai_base_url="http://127.0.0.1:9/v1",
        openai_api_key=Secret("sk-test"),
        anthropic_base_url="http://127.0.0.1:8",
        anthropic_api_key=Secret("ak-test"),
        timeout=2.5,
        retries=0,
        max_output_tokens=100,
    )


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        (
            "SOULFLEET_MODEL_TIMEOUT",
            "fast",
            "must be a duration such as 90, 90s, 30m or 6h; got 'fast'",
        ),
        ("SOULFLEET_MODEL_TIMEOUT", "0.05", "must be a duration >= 0.1s, got '0.05'"),
        ("SOULFLEET_MODEL_RETRIES", "-1", "must be >= 0, got -1"),
        ("SOULFLEET_MODEL_RETRIES", "two", "must be a whole number, got 'two'"),
        ("SOULFLEET_MODEL_MAX_OUTPUT_TOKENS", "0", "must be >= 1, got 0"),
    ],
)
def test_bad_numbers_name_the_variable(name: str, raw: str, message: str) -> None:
    """A bad number is a SettingsError naming the variable and quoting the problem."""
    with pytest.raises(SettingsError) as caught:
        ModelConfig.from_env({name: raw})
    assert caught.value.variable == name
    assert str(caught.value) == f"{name} {message}"

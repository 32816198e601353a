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


@pytest.mark.parametrize("name", ["OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"])
@pytest.mark.parametrize(
    "url", ["bogus", "ftp://host/v1", "http:///v1", "https://[::1/v1", "http://127.0.0.1:abc/v1"]
)
def test_a_base_url_that_is_not_http_is_refused_at_start_naming_the_variable(
    name: str, url: str
) -> None:
    """A typo in a provider's base URL let every worker and beat start; each lane of that
    provider was then dead-lettered at its first turn (the URL is checked when a client is
    built). Read at start, it is a SettingsError naming the variable, as the README says."""
    with pytest.raises(SettingsError, match=f"^{name} must be an http\\(s\\) URL") as raised:
        ModelConfig.from_env({name: url}, reach=False)
    assert raised.value.variable == name


def test_a_refused_base_url_does_not_show_its_password_or_query() -> None:
    """The error is logged and printed: credentials in the URL and its query are not."""
    with pytest.raises(SettingsError) as raised:
        ModelConfig.from_env({"OPENAI_BASE_URL": "htp://me:hunter22@host/v1?api-key=sk-x"})
    assert "hunter22" not in str(raised.value)
    assert "sk-x" not in str(raised.value)

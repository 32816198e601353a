"""Model provider configuration, read from the environment once and frozen.

The variable names are the official SDKs' own conventions, so an environment already set up for
the OpenAI or Anthropic SDK works unchanged. Keys are held in :class:`Secret`, whose ``repr``
and ``str`` never show the value: a settings object can be logged whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from workers.persona.env import EnvReader

__all__ = ["ModelConfig", "Secret"]


class Secret:
    """A credential that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The real value: only for building the request header."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model a fleet uses by default, and how to reach the providers.

    ``default_spec`` is ``SOULFLEET_MODEL``; empty means the built-in scripted model.
    """

    default_spec: str = ""
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: Secret = field(default_factory=lambda: Secret(""))
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key: Secret = field(default_factory=lambda: Secret(""))
    timeout: float = 300.0
    retries: int = 3
    max_output_tokens: int = 4096

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ModelConfig:
        """Parse ``environ`` (default ``os.environ``); a bad value raises SettingsError."""
        env = EnvReader(os.environ if environ is None else environ)
        return cls(
            default_spec=env.text("SOULFLEET_MODEL", ""),
            openai_base_url=env.text("OPENAI_BASE_URL", "https://api.openai.com/v1"),
            openai_api_key=Secret(env.text("OPENAI_API_KEY", "")),
            anthropic_base_url=env.text("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
            anthropic_api_key=Secret(env.text("ANTHROPIC_API_KEY", "")),
            timeout=env.number("SOULFLEET_MODEL_TIMEOUT", 300.0, minimum=0.1),
            retries=env.integer("SOULFLEET_MODEL_RETRIES", 3, minimum=0),
            max_output_tokens=env.integer("SOULFLEET_MODEL_MAX_OUTPUT_TOKENS", 4096, minimum=1),
        )

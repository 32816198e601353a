"""Model provider configuration, read from the environment once and frozen.

The variable names are the official SDKs' own conventions, so an environment already set up for
the OpenAI or Anthropic SDK works unchanged. Keys are held in :class:`Secret`, whose ``repr``
and ``str`` never show the value: a settings object can be logged whole.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from workers.persona.errors import SettingsError

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


def _float(environ: Mapping[str, str], name: str, default: float, minimum: float) -> float:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(name, f"must be a number, got {raw!r}") from None
    if math.isnan(value) or value < minimum:
        raise SettingsError(name, f"must be a number >= {minimum}, got {raw!r}")
    return value


def _int(environ: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(name, f"must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(name, f"must be >= {minimum}, got {value}")
    return value


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
        env = os.environ if environ is None else environ
        return cls(
            default_spec=(env.get("SOULFLEET_MODEL") or "").strip(),
            openai_base_url=(env.get("OPENAI_BASE_URL") or "").strip()
            or "https://api.openai.com/v1",
            openai_api_key=Secret((env.get("OPENAI_API_KEY") or "").strip()),
            anthropic_base_url=(env.get("ANTHROPIC_BASE_URL") or "").strip()
            or "https://api.anthropic.com",
            anthropic_api_key=Secret((env.get("ANTHROPIC_API_KEY") or "").strip()),
            timeout=_float(env, "SOULFLEET_MODEL_TIMEOUT", 300.0, 0.1),
            retries=_int(env, "SOULFLEET_MODEL_RETRIES", 3, 0),
            max_output_tokens=_int(env, "SOULFLEET_MODEL_MAX_OUTPUT_TOKENS", 4096, 1),
        )

"""Model provider configuration, read from the environment once and frozen.

The variable names are the official SDKs' own conventions, so an environment already set up for
the OpenAI or Anthropic SDK works unchanged. Keys are held in :class:`Secret`, whose ``repr``
and ``str`` never show the value: a settings object can be logged whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from workers.persona.env import EnvReader
from workers.persona.errors import SettingsError
from workers.persona.urls import is_http_url, mask_credentials

__all__ = ["ACCEPTED_FORMS", "PROVIDERS", "ModelConfig", "Secret", "spec_problem"]

ACCEPTED_FORMS = "'openai:<model>', 'anthropic:<model>', 'scripted:<path>' or 'inherit'"
PROVIDERS = ("openai", "anthropic", "scripted")


def spec_problem(text: str) -> str | None:
    """What is wrong with the SHAPE of a model spec (None if nothing): no I/O, no provider call.

    Every process checks ``SOULFLEET_MODEL`` with this at start, so ``foo:bar`` stops a worker
    at the door instead of dead-lettering every lane it touches.
    """
    stripped = text.strip()
    if stripped.lower() in ("", "inherit"):
        return None
    provider, colon, rest = stripped.partition(":")
    if not colon or provider.strip().lower() not in PROVIDERS:
        return f"is not a model spec ({stripped!r}): expected {ACCEPTED_FORMS}"
    if not rest.strip():
        what = "path" if provider.strip().lower() == "scripted" else "model name"
        return f"names no {what} ({stripped!r}): expected {ACCEPTED_FORMS}"
    return None


def _check_default(spec: str, anthropic_key: str) -> SettingsError | None:
    """Raise for a spec of the wrong shape; RETURN what keeps this process from reaching the
    model (a missing key or scripted file): an error for a process that calls it, only a
    warning for one that does not (a CLI command in a shell without the workers' secrets)."""
    problem = spec_problem(spec)
    if problem is not None:
        raise SettingsError("SOULFLEET_MODEL", problem)
    provider, _, rest = spec.strip().partition(":")
    provider, rest = provider.strip().lower(), rest.strip()
    if provider == "anthropic" and not anthropic_key:
        return SettingsError(
            "ANTHROPIC_API_KEY", f"is required: SOULFLEET_MODEL is {spec.strip()!r}, and the "
            "Anthropic API refuses every call without a key"
        )  # fmt: skip
    if provider == "scripted" and rest != "builtin" and not Path(rest).expanduser().is_file():
        return SettingsError(
            "SOULFLEET_MODEL", f"names a scripted model file that does not exist: "
            f"{Path(rest).expanduser().resolve()} (a relative path means the working directory)"
        )  # fmt: skip
    return None


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
    #: What keeps THIS process from calling the default model, when parsed with
    #: ``reach=False`` (a missing key, a missing scripted file): for a warning.
    unreachable: str = ""

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, reach: bool = True
    ) -> ModelConfig:
        """Parse ``environ`` (default ``os.environ``); a bad value raises SettingsError.

        ``reach=False`` is for a process that never calls the default model itself (a CLI
        command that only queues work): a missing key or scripted file is then recorded in
        :attr:`unreachable` instead of raised, since the workers may well have them."""
        env = EnvReader(os.environ if environ is None else environ)
        default_spec = env.text("SOULFLEET_MODEL", "")
        unreachable = _check_default(default_spec, env.text("ANTHROPIC_API_KEY", ""))
        if unreachable is not None and reach:
            raise unreachable
        return cls(
            default_spec=default_spec,
            openai_base_url=_base_url(env, "OPENAI_BASE_URL", "https://api.openai.com/v1"),
            openai_api_key=Secret(env.text("OPENAI_API_KEY", "")),
            anthropic_base_url=_base_url(env, "ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
            anthropic_api_key=Secret(env.text("ANTHROPIC_API_KEY", "")),
            timeout=env.duration("SOULFLEET_MODEL_TIMEOUT", 300.0, minimum=0.1),
            retries=env.integer("SOULFLEET_MODEL_RETRIES", 3, minimum=0),
            max_output_tokens=env.integer("SOULFLEET_MODEL_MAX_OUTPUT_TOKENS", 4096, minimum=1),
            unreachable="" if unreachable is None else str(unreachable),
        )


def _base_url(env: EnvReader, name: str, default: str) -> str:
    """A provider's base URL, refused at start unless http(s) with a host: a typo otherwise
    let every process start and dead-lettered each lane of that provider at its first turn."""
    url = env.text(name, default)
    if not is_http_url(url):
        shown = mask_credentials(url.split("?", 1)[0])
        raise SettingsError(name, f"must be an http(s) URL with a host, got {shown!r}")
    return url

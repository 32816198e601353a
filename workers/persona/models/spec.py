"""Model spec strings -> Model: the one place that knows which strings name which model.

Accepted forms (everywhere a model is chosen: an argument, ``SOULFLEET_MODEL``, persona.toml):

- ``openai:<model>``    any OpenAI-compatible Chat Completions server (``OPENAI_BASE_URL``);
  the model name may itself hold colons (``openai:llama3.1:8b`` for Ollama);
- ``anthropic:<model>`` the Anthropic Messages API (``ANTHROPIC_BASE_URL``);
- ``scripted:<path>``   the deterministic offline model; a relative path is resolved against
  ``base_dir`` (a persona's own directory) when given, else the working directory;
  ``scripted:builtin`` is the built-in script (the spec that model reports, so it round-trips);
- empty or ``inherit``  the fleet default (``SOULFLEET_MODEL``), and with none configured, the
  built-in scripted model.

HTTP models are cached per (provider, model, connection settings): resolving the same spec for
every turn reuses one client and its connection pool (TLS handshakes are not free) instead of
leaking a pool per turn. The clients are thread-safe, so the cache is shared by every thread.
"""

from __future__ import annotations

import threading
from pathlib import Path

from workers.persona.errors import ModelSpecError
from workers.persona.models import Model
from workers.persona.models.anthropic import AnthropicModel
from workers.persona.models.config import ModelConfig
from workers.persona.models.openai import OpenAIModel

__all__ = ["ACCEPTED_FORMS", "BUILTIN", "INHERIT", "provider_of", "resolve_model"]

INHERIT = "inherit"
BUILTIN = "builtin"
ACCEPTED_FORMS = "'openai:<model>', 'anthropic:<model>', 'scripted:<path>' or 'inherit'"
_PROVIDERS = ("openai", "anthropic", "scripted")
_CACHE_MAX = 64

_cache: dict[tuple[object, ...], OpenAIModel | AnthropicModel] = {}
_cache_lock = threading.Lock()


def resolve_model(spec: str | None, config: ModelConfig, *, base_dir: Path | None = None) -> Model:
    """The model ``spec`` names; ModelSpecError (listing the accepted forms) if it names none."""
    text = (spec or "").strip()
    if text.lower() in ("", INHERIT):
        default = config.default_spec.strip()
        if default.lower() in ("", INHERIT):
            from workers.persona.models.scripted import ScriptedModel  # noqa: PLC0415

            return ScriptedModel.builtin()
        # The fleet default is fleet-wide: its relative paths mean the working directory,
        # never the directory of whichever persona inherited it.
        return _parse(default, config, base_dir=None, origin="SOULFLEET_MODEL ")
    return _parse(text, config, base_dir=base_dir, origin="")


def provider_of(model: Model) -> str:
    """``"openai"``, ``"anthropic"``, ``"scripted"`` or ``"other"`` (a metric label).

    Read from the spec string, so a wrapper that keeps the wrapped model's spec (the fleet's
    gated model does) is labelled by what it wraps.
    """
    if isinstance(model, OpenAIModel | AnthropicModel):
        return model.provider
    head = model.spec.partition(":")[0].strip().lower()
    return head if head in _PROVIDERS else "other"


def _parse(text: str, config: ModelConfig, *, base_dir: Path | None, origin: str) -> Model:
    provider, colon, rest = text.partition(":")
    provider = provider.strip().lower()
    rest = rest.strip()
    if not colon or provider not in _PROVIDERS:
        raise ModelSpecError(f"unknown {origin}model spec {text!r}: expected {ACCEPTED_FORMS}")
    if not rest:
        what = "path" if provider == "scripted" else "model name"
        raise ModelSpecError(
            f"{origin}model spec {text!r} has no {what}: expected {ACCEPTED_FORMS}"
        )
    if provider == "scripted":
        from workers.persona.models.scripted import ScriptedModel  # noqa: PLC0415

        if rest == BUILTIN:
            return ScriptedModel.builtin()
        path = Path(rest).expanduser()
        if not path.is_absolute():
            path = (base_dir if base_dir is not None else Path.cwd()) / path
        return ScriptedModel.from_path(path)
    return _http_model(provider, rest, config)


def _http_model(provider: str, name: str, config: ModelConfig) -> OpenAIModel | AnthropicModel:
    if provider == "openai":
        where: tuple[object, ...] = (config.openai_base_url, config.openai_api_key)
    else:
        where = (config.anthropic_base_url, config.anthropic_api_key)
    key = (provider, name, *where, config.timeout, config.retries, config.max_output_tokens)
    with _cache_lock:
        model = _cache.get(key)
        if model is not None and not model.closed:
            return model
        model = OpenAIModel(name, config) if provider == "openai" else AnthropicModel(name, config)
        if len(_cache) >= _CACHE_MAX:
            # Evicted models are not closed: another thread may still be mid-call on one.
            _cache.pop(next(iter(_cache)))
        _cache[key] = model
        return model

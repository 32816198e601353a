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

Models are cached, so resolving the same spec for every turn is cheap: HTTP models per
(provider, model, connection settings), reusing one client and its connection pool (TLS
handshakes are not free) instead of leaking a pool per turn; scripted models per (rules file,
its mtime and size), so a rules file is parsed once, and an edited one is picked up on the next
turn like every other file in a persona home. Models are thread-safe, so the caches are shared
by every thread.
"""

from __future__ import annotations

import threading
from pathlib import Path

from workers.persona.errors import ModelSpecError
from workers.persona.models import Model
from workers.persona.models.anthropic import AnthropicModel
from workers.persona.models.config import ACCEPTED_FORMS, PROVIDERS, ModelConfig
from workers.persona.models.openai import OpenAIModel

__all__ = [
    "ACCEPTED_FORMS",
    "BUILTIN",
    "INHERIT",
    "PAID_PROVIDERS",
    "SCRIPTED_MAX",
    "inherits",
    "provider_of",
    "resolve_model",
]

INHERIT = "inherit"
BUILTIN = "builtin"
#: Providers that are called over the network and billed (the breaker and spend watch these).
PAID_PROVIDERS = ("openai", "anthropic")
_PROVIDERS = PROVIDERS
_CACHE_MAX = 64
#: Parsed rules files kept per process: one per persona with its own script, so sized like the
#: persona definitions' cache (a fleet of scripted personas otherwise re-parses every turn).
SCRIPTED_MAX = 4096

_cache: dict[tuple[object, ...], OpenAIModel | AnthropicModel] = {}
_cache_lock = threading.Lock()
# resolved rules path -> ((mtime_ns, size), model)
_scripted: dict[Path, tuple[tuple[int, int], Model]] = {}


def inherits(spec: str | None) -> bool:
    """Whether ``spec`` names no model of its own (``"inherit"``, any case, or nothing): the
    next level of the precedence decides."""
    return (spec or "").strip().lower() in ("", INHERIT)


def resolve_model(spec: str | None, config: ModelConfig, *, base_dir: Path | None = None) -> Model:
    """The model ``spec`` names; ModelSpecError (listing the accepted forms) if it names none."""
    text = (spec or "").strip()
    if inherits(text):
        default = config.default_spec.strip()
        if inherits(default):
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
        return _scripted_model(path)
    return _http_model(provider, rest, config)


def _scripted_model(path: Path) -> Model:
    from workers.persona.models.scripted import ScriptedModel  # noqa: PLC0415

    try:
        stat = path.stat()
    except OSError:
        return ScriptedModel.from_path(path)  # raises the clear ModelSpecError
    version = (stat.st_mtime_ns, stat.st_size)
    with _cache_lock:
        cached = _scripted.get(path)
        if cached is not None and cached[0] == version:
            _scripted[path] = _scripted.pop(path)  # most recently used last
            return cached[1]
    model = ScriptedModel.from_path(path)
    with _cache_lock:
        if len(_scripted) >= SCRIPTED_MAX and path not in _scripted:
            _scripted.pop(next(iter(_scripted)))
        _scripted[path] = (version, model)
    return model


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

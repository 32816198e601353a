"""Spec strings -> models: the accepted forms, inheritance, errors, and provider labels."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from workers.persona.errors import ModelSpecError
from workers.persona.messages import Completion, Message, ToolSpec
from workers.persona.models import Model, spec
from workers.persona.models.anthropic import AnthropicModel
from workers.persona.models.config import ModelConfig, Secret
from workers.persona.models.openai import OpenAIModel
from workers.persona.models.scripted import ScriptedModel
from workers.persona.models.spec import provider_of, resolve_model

CONFIG = ModelConfig(
    openai_base_url="http://127.0.0.1:9/v1",
    anthropic_base_url="http://127.0.0.1:9",
    anthropic_api_key=Secret("k"),
)


def write_script(path: Path, text: str) -> Path:
    path.write_text(json.dumps({"rules": [{"name": "only", "text": text}]}), encoding="utf-8")
    return path


def answer(model: Model) -> str:
    return model.complete(system="", messages=[Message("user", "hi")], tools=[]).text


def test_openai_and_anthropic_specs() -> None:
    """Provider prefixes build the matching client with the model name after the first colon."""
    openai = resolve_model("openai:llama3.1:8b", CONFIG)
    assert isinstance(openai, OpenAIModel)
    assert openai.spec == "openai:llama3.1:8b"
    claude = resolve_model("  Anthropic:claude-sonnet-4-5 ", CONFIG)
    assert isinstance(claude, AnthropicModel)
    assert claude.spec == "anthropic:claude-sonnet-4-5"


def test_http_models_are_reused_until_closed() -> None:
    """The same spec and settings give the same client (one pool); a closed one is replaced."""
    first = resolve_model("openai:reuse-me", CONFIG)
    assert resolve_model("openai:reuse-me", CONFIG) is first
    other = ModelConfig(openai_base_url="http://127.0.0.1:10/v1")
    assert resolve_model("openai:reuse-me", other) is not first
    assert isinstance(first, OpenAIModel)
    first.close()
    assert resolve_model("openai:reuse-me", CONFIG) is not first


@pytest.mark.parametrize("spec", [None, "", "  ", "inherit", "INHERIT"])
def test_inherit_uses_the_fleet_default(spec: str | None) -> None:
    """No spec, or "inherit", means SOULFLEET_MODEL."""
    config = ModelConfig(default_spec="openai:fleet-default", openai_base_url="http://h/v1")
    model = resolve_model(spec, config)
    assert model.spec == "openai:fleet-default"


@pytest.mark.parametrize("default", ["", "inherit"])
def test_no_default_is_the_builtin_scripted_model(default: str) -> None:
    """With no model configured anywhere, the built-in scripted model answers."""
    model = resolve_model("inherit", ModelConfig(default_spec=default))
    assert isinstance(model, ScriptedModel)
    assert model.spec == ScriptedModel.builtin().spec
    assert provider_of(model) == "scripted"


def test_scripted_builtin_spec_round_trips() -> None:
    """The spec the built-in model reports resolves back to the built-in model."""
    builtin = ScriptedModel.builtin()
    model = resolve_model(builtin.spec, CONFIG)
    assert isinstance(model, ScriptedModel)
    assert model.spec == builtin.spec


def test_scripted_relative_path_uses_base_dir(tmp_path: Path) -> None:
    """A relative scripted path is resolved in the persona's own directory."""
    write_script(tmp_path / "script.json", "from the persona dir")
    assert answer(resolve_model("scripted:script.json", CONFIG, base_dir=tmp_path)) == (
        "from the persona dir"
    )


def test_a_scripted_model_is_parsed_once_and_follows_edits(tmp_path: Path) -> None:
    """An unchanged rules file gives the same model (parsed once); an edited one is rebuilt,
    so the persona's next turn answers from the new rules."""
    script = write_script(tmp_path / "rules.json", "one")
    first = resolve_model("scripted:rules.json", CONFIG, base_dir=tmp_path)
    assert resolve_model("scripted:rules.json", CONFIG, base_dir=tmp_path) is first
    write_script(script, "second")  # a different size: a change even within one mtime tick
    again = resolve_model("scripted:rules.json", CONFIG, base_dir=tmp_path)
    assert again is not first
    assert answer(again) == "second"


def test_scripted_models_of_a_large_fleet_stay_parsed(tmp_path: Path) -> None:
    """The cache holds a rules file per persona for a fleet of thousands: 1,000 personas'
    scripts are each parsed once (it held 64)."""
    homes = [tmp_path / f"p{i}" for i in range(1000)]
    first = {}
    for home in homes:
        home.mkdir()
        write_script(home / "rules.json", home.name)
        first[home] = resolve_model("scripted:rules.json", CONFIG, base_dir=home)
    assert all(resolve_model("scripted:rules.json", CONFIG, base_dir=h) is first[h] for h in homes)


def test_the_least_recently_used_script_leaves_the_cache_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the cache is full the script used longest ago goes, not the one parsed first."""
    monkeypatch.setattr(spec, "SCRIPTED_MAX", 3)
    monkeypatch.setattr(spec, "_scripted", {})  # this process's cache, empty
    homes = {name: tmp_path / name for name in "abcd"}
    models = {}
    for name, home in homes.items():
        home.mkdir()
        write_script(home / "rules.json", name)
    for name in "abc":
        models[name] = resolve_model("scripted:rules.json", CONFIG, base_dir=homes[name])
    resolve_model("scripted:rules.json", CONFIG, base_dir=homes["a"])  # a: used again
    resolve_model("scripted:rules.json", CONFIG, base_dir=homes["d"])  # full: b goes
    assert resolve_model("scripted:rules.json", CONFIG, base_dir=homes["a"]) is models["a"]
    assert resolve_model("scripted:rules.json", CONFIG, base_dir=homes["c"]) is models["c"]
    assert resolve_model("scripted:rules.json", CONFIG, base_dir=homes["b"]) is not models["b"]


def test_scripted_relative_path_defaults_to_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without base_dir a relative scripted path means the working directory."""
    write_script(tmp_path / "here.json", "from cwd")
    monkeypatch.chdir(tmp_path)
    assert answer(resolve_model("scripted:here.json", CONFIG)) == "from cwd"


def test_scripted_absolute_path_ignores_base_dir(tmp_path: Path) -> None:
    """An absolute scripted path is used as is."""
    script = write_script(tmp_path / "abs.json", "absolute")
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert answer(resolve_model(f"scripted:{script}", CONFIG, base_dir=other)) == "absolute"


def test_inherited_scripted_path_ignores_base_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path in SOULFLEET_MODEL is fleet-wide: cwd, not the inheriting persona's dir."""
    write_script(tmp_path / "fleet.json", "fleet script")
    persona = tmp_path / "ava"
    persona.mkdir()
    write_script(persona / "fleet.json", "persona script")
    monkeypatch.chdir(tmp_path)
    config = ModelConfig(default_spec="scripted:fleet.json")
    assert answer(resolve_model("inherit", config, base_dir=persona)) == "fleet script"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("gpt-4o", "unknown model spec"),
        ("foo:bar", "unknown model spec"),
        ("openai:", "has no model name"),
        ("anthropic:  ", "has no model name"),
        ("scripted:", "has no path"),
    ],
)
def test_bad_specs_list_the_accepted_forms(spec: str, problem: str) -> None:
    """A spec naming no model is a ModelSpecError that says what is accepted."""
    with pytest.raises(ModelSpecError) as caught:
        resolve_model(spec, CONFIG)
    message = str(caught.value)
    assert problem in message
    assert repr(spec.strip()) in message
    for form in ("openai:<model>", "anthropic:<model>", "scripted:<path>", "inherit"):
        assert form in message


def test_bad_fleet_default_names_soulfleet_model() -> None:
    """A bad SOULFLEET_MODEL is reported as such when a persona inherits it."""
    with pytest.raises(ModelSpecError, match="SOULFLEET_MODEL"):
        resolve_model("inherit", ModelConfig(default_spec="gpt-4o"))


def test_missing_scripted_file(tmp_path: Path) -> None:
    """A scripted spec naming a missing file is a ModelSpecError naming the resolved path."""
    with pytest.raises(ModelSpecError, match=str(tmp_path / "nope.toml")):
        resolve_model("scripted:nope.toml", CONFIG, base_dir=tmp_path)


class _Wrapper:
    """A model wrapper that reports the wrapped spec (like the fleet's gated model)."""

    def __init__(self, spec: str) -> None:
        self._spec = spec

    @property
    def spec(self) -> str:
        return self._spec

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        return Completion(text="")


def test_provider_of() -> None:
    """Provider labels come from the client type or the spec prefix; anything else is "other"."""
    assert provider_of(resolve_model("openai:m", CONFIG)) == "openai"
    assert provider_of(resolve_model("anthropic:m", CONFIG)) == "anthropic"
    assert provider_of(ScriptedModel.builtin()) == "scripted"
    assert provider_of(_Wrapper("anthropic:claude")) == "anthropic"
    assert provider_of(_Wrapper("mystery")) == "other"
    assert provider_of(_Wrapper("azure:gpt")) == "other"

"""workers/model_cache.py: one model per spec per process; a scripted model follows its file."""

from __future__ import annotations

import os
from pathlib import Path

from workers.model_cache import ModelCache
from workers.persona.models.config import ModelConfig


def test_models_are_shared_and_inherit_means_the_fleet_default(tmp_path: Path) -> None:
    """The same spec gives the same instance; "inherit" and "" resolve to the fleet default."""
    cache = ModelCache(ModelConfig(default_spec="openai:gpt-test", openai_base_url="http://127.0.0.1:9/v1"))
    first = cache.get("inherit", tmp_path)
    assert first is cache.get("", tmp_path)
    assert first.spec == "openai:gpt-test"


def test_an_edited_rules_file_is_picked_up_on_the_next_turn(tmp_path: Path) -> None:
    """Editing a persona's scripted rules rebuilds its model; an unchanged file reuses it."""
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rules]]\ntext = "one"\n')
    cache = ModelCache(ModelConfig())
    before = cache.get("scripted:rules.toml", tmp_path)
    assert cache.get("scripted:rules.toml", tmp_path) is before
    rules.write_text('[[rules]]\ntext = "two"\n')
    stat = rules.stat()
    os.utime(rules, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = cache.get("scripted:rules.toml", tmp_path)
    assert after is not before
    reply = after.complete(system="", messages=[], tools=[])
    assert reply.text == "two"

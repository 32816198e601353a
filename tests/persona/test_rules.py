"""Tests for workers/persona/models/rules.py: the rules file format and its load-time errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workers.persona.errors import ModelSpecError
from workers.persona.messages import Message, ToolSpec
from workers.persona.models.rules import load_rules, parse_rules
from workers.persona.models.scripted import ScriptedModel

SOUL = "## SOUL.md\n\nme\n\n## MEMORY.md\n\n- tea"


def ask(model: ScriptedModel, text: str) -> tuple[str, list[dict[str, Any]]]:
    answer = model.complete(
        system=SOUL,
        messages=[Message(role="user", content=text)],
        tools=[ToolSpec("memory", "m", {})],
    )
    return answer.text, [dict(c.arguments) for c in answer.tool_calls]


TOML_RULES = """
[[rules]]
name = "greet"
when = { user_contains = "hello" }
text = "hi from {sections}"

[[rules]]
name = "note"
calls = [{ tool = "memory", args = { action = "add", text = "{user}" } }]
"""


def test_toml_and_json_files_load_to_the_same_behaviour(tmp_path: Path) -> None:
    """The same rules as .toml and as .json answer identically."""
    toml_path = tmp_path / "rules.toml"
    toml_path.write_text(TOML_RULES)
    json_path = tmp_path / "rules.json"
    json_path.write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "name": "greet",
                        "when": {"user_contains": "hello"},
                        "text": "hi from {sections}",
                    },
                    {
                        "name": "note",
                        "calls": [{"tool": "memory", "args": {"action": "add", "text": "{user}"}}],
                    },
                ]
            }
        )
    )
    for path in (toml_path, json_path):
        model = ScriptedModel.from_path(path)
        assert model.spec == f"scripted:{path}"
        assert ask(model, "hello") == ("hi from SOUL.md, MEMORY.md", [])
        assert ask(model, "bye") == ("", [{"action": "add", "text": "bye"}])


@pytest.mark.parametrize(
    ("rules", "where"),
    [
        ([{"text": "a"}, {"when": {"user_regex": "("}, "text": "b"}], "rules[1].when.user_regex"),
        ([{"when": {"usr_contains": "x"}, "text": "a"}], "rules[0].when.usr_contains"),
        ([{"txt": "a"}], "rules[0].txt"),
        ([{"name": "empty"}], "rules[0] (empty).text"),
        ([{"when": {"tool_results": -1}, "text": "a"}], "rules[0].when.tool_results"),
        ([{"when": {"tool_results": True}, "text": "a"}], "rules[0].when.tool_results"),
        ([{"when": {"heartbeat": "yes"}, "text": "a"}], "rules[0].when.heartbeat"),
        ([{"when": {"section_contains": "x"}, "text": "a"}], "rules[0].when.section"),
        ([{"text": 3}], "rules[0].text"),
        ([{"text": "{nope}"}], "rules[0].text"),
        ([{"calls": [{"tool": "m", "args": {"t": ["{bad}"]}}]}], "rules[0].calls[0].args.t[0]"),
        ([{"calls": [{"args": {}}]}], "rules[0].calls[0].tool"),
        ([{"calls": {"tool": "m"}}], "rules[0].calls"),
        ([{"text": "a", "sleep": -1}], "rules[0].sleep"),
        (["not a table"], "rules[0]"),
    ],
)
def test_rule_errors_name_the_rule_index_and_field(rules: list[Any], where: str) -> None:
    """A bad rule fails at load time with a ModelSpecError naming rules[i] and the field."""
    with pytest.raises(ModelSpecError) as raised:
        parse_rules({"rules": rules})
    assert where in str(raised.value)


def test_a_rules_file_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    """TOML and JSON rules saved with a UTF-8 byte-order mark load as without it."""
    for name, text in (("r.toml", '[[rules]]\ntext = "hi"\n'),
                       ("r.json", '{"rules": [{"text": "hi"}]}')):  # fmt: skip
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert load_rules(tmp_path / name) == parse_rules({"rules": [{"text": "hi"}]}, source=name)


def test_file_errors_are_clear(tmp_path: Path) -> None:
    """Missing file, bad TOML/JSON, wrong suffix and a missing rules list each say so."""
    with pytest.raises(ModelSpecError, match="not found"):
        load_rules(tmp_path / "absent.toml")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[[rules]\n")
    with pytest.raises(ModelSpecError, match="not valid TOML"):
        load_rules(bad_toml)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    with pytest.raises(ModelSpecError, match="not valid JSON"):
        load_rules(bad_json)
    yaml = tmp_path / "rules.yaml"
    yaml.write_text("rules: []")
    with pytest.raises(ModelSpecError, match=r"\.toml or \.json"):
        load_rules(yaml)
    no_rules = tmp_path / "none.toml"
    no_rules.write_text('fallback = "x"\n')
    with pytest.raises(ModelSpecError, match="fallback"):
        load_rules(no_rules)
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(ModelSpecError, match="rules"):
        load_rules(empty)


def test_rules_are_validated_into_frozen_values() -> None:
    """parse_rules returns Rule values with compiled regexes, in file order, indexed."""
    rules = parse_rules(
        {"rules": [{"name": "a", "when": {"user_regex": "x+"}, "text": "1"}, {"text": "2"}]}
    )
    assert [(r.index, r.name, r.text) for r in rules] == [(0, "a", "1"), (1, "#1", "2")]
    assert rules[0].user_regex is not None
    assert rules[0].user_regex.pattern == "x+"


def test_error_messages_name_the_source(tmp_path: Path) -> None:
    """A load error from a file names the file path as well as the field."""
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"rules": [{"when": {"user_regex": "["}, "text": "x"}]}))
    with pytest.raises(ModelSpecError, match=r"bad\.json: rules\[0\]\.when\.user_regex"):
        load_rules(path)

"""`soulfleet tools PERSONA`: a persona's tools as the model sees them, servers started to ask."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.cli.conftest import Invoke
from tests.support.cli import run_soulfleet
from tests.support.mcp_helpers import SERVER_SCRIPT, new_tag, tagged_pids, wait_gone
from workers.persona.agent import from_dir
from workers.persona.mcp_hub import McpHub
from workers.persona.toolbox import build_declared


def _persona(root: Path, toml: str) -> Path:
    home = root / "handy"
    home.mkdir()
    (home / "SOUL.md").write_text("You are handy.\n", encoding="utf-8")
    (home / "persona.toml").write_text(toml, encoding="utf-8")
    return home


@pytest.mark.integration
def test_tools_lists_the_model_view_and_names_an_unreachable_server(
    invoke: Invoke, tmp_path: Path
) -> None:
    """--json lists every tool in turn order (declared in file order, memory last) with name,
    source, description and schema; a server that cannot start is named with its error and
    the exit status is 1; no server process is left when the command ends."""
    tag = new_tag()
    home = _persona(
        tmp_path,
        f'[[tools.mcp]]\nname = "t"\ncommand = "{sys.executable}"\n'
        f'args = ["{SERVER_SCRIPT}", "--tag", "{tag}"]\nallow = ["echo", "sleep"]\n'
        '[[tools.python]]\nref = "tests.support.python_tools:shout"\n'
        '[[tools.mcp]]\nname = "gone"\ncommand = "no-such-mcp-server-here"\n',
    )
    result = invoke("tools", str(home), "--json")
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)
    assert [(t["name"], t["source"]) for t in payload["tools"]] == [
        ("t__echo", "mcp"),
        ("t__sleep", "mcp"),
        ("shout", "python"),
        ("memory", "builtin"),
    ]
    echo = payload["tools"][0]
    assert echo["description"] == "Return the text you send."
    assert echo["input_schema"]["properties"]["text"]["type"] == "string"
    assert (echo["server"], echo["server_tool"]) == ("t", "echo")
    [missing] = payload["unavailable"]
    assert missing["server"] == "gone"
    assert "not found on PATH" in missing["error"]
    wait_gone(tag)
    assert tagged_pids(tag) == []

    text = invoke("tools", str(home))
    assert text.exit_code == 1
    assert text.stdout.splitlines()[0].startswith("t__echo  [mcp ")
    assert "unavailable: server 'gone' (no-such-mcp-server-here)" in text.stderr
    wait_gone(tag)


@pytest.mark.integration
def test_an_allow_list_naming_a_missing_tool_lists_it_as_unavailable(
    invoke: Invoke, tmp_path: Path
) -> None:
    """The server is asked; an allow-list entry it does not list is reported as unavailable
    (exit 1, naming the key and the missing name) and the allowed tool it lists is shown."""
    tag = new_tag()
    home = _persona(
        tmp_path,
        f'[[tools.mcp]]\nname = "t"\ncommand = "{sys.executable}"\n'
        f'args = ["{SERVER_SCRIPT}", "--tag", "{tag}"]\nallow = ["echo", "teleport"]\n',
    )
    result = invoke("tools", str(home))
    assert result.exit_code == 1
    assert "tools.mcp[0].allow names tools the server does not list: ['teleport']" in (
        result.stderr
    )
    assert result.stdout.startswith("t__echo  [mcp ")
    assert "t__whoami" not in result.stdout
    wait_gone(tag)
    assert tagged_pids(tag) == []


def test_a_bad_ref_is_an_invalid_persona(invoke: Invoke, tmp_path: Path) -> None:
    """A ref that does not import: one line naming the key and the file, exit 2."""
    home = _persona(tmp_path, '[[tools.python]]\nref = "tests.support.nowhere:tool"\n')
    result = invoke("tools", str(home))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "persona.toml: key 'tools.python[0].ref' cannot import module" in result.stderr


def test_a_persona_with_no_tools_says_so(invoke: Invoke, tmp_path: Path) -> None:
    """`memory = false` and nothing declared: one line saying there are no tools (it printed
    nothing at all, exit 0, which reads as a failure to list)."""
    home = _persona(tmp_path, "memory = false\n")
    result = invoke("tools", str(home))
    assert result.exit_code == 0, result.output
    assert result.stdout == "persona handy has no tools (memory = false, none declared)\n"
    assert json.loads(invoke("tools", str(home), "--json").stdout)["tools"] == []


def test_the_readme_python_tool_is_listed_and_adds(
    env: Mapping[str, str | None], tmp_path: Path
) -> None:
    """The README's mytools.py, as written, on PYTHONPATH: `soulfleet tools` lists `add`, and
    the tool the persona gets adds (the exported Tool was a Protocol no one could build)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    [module] = re.findall(r"```python\n(# mytools\.py.+?)\n```", readme, re.DOTALL)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "mytools.py").write_text(module, encoding="utf-8")
    home = _persona(tmp_path, '[[tools.python]]\nref = "mytools:adder"\n')
    listed = run_soulfleet("tools", str(home), "--json",
                           env={**env, "PYTHONPATH": str(tmp_path / "lib")})  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    names = [tool["name"] for tool in json.loads(listed.stdout)["tools"]]
    assert names == ["add", "memory"]
    sys.path.insert(0, str(tmp_path / "lib"))
    try:
        box = build_declared(from_dir(home).declared, hub=McpHub())
    finally:
        sys.path.remove(str(tmp_path / "lib"))
        sys.modules.pop("mytools", None)
    [add] = box.tools
    assert add.execute({"a": 2, "b": 40}).output == "42"
    # A scripted rule's placeholders are strings: "2" and "3" made "23".
    assert add.execute({"a": "2", "b": "3"}).output == "5"

"""persona.toml ``[tools]`` and the fleet's ``mcpServers`` file: shapes, order, loud errors.

Every error names the dotted key and the file, like any other persona.toml error, because a
silently ignored tool is a persona that cannot do what its owner thinks it can.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.persona.errors import PersonaConfigError, SettingsError
from workers.persona.manifest import load_manifest, parse_manifest
from workers.persona.mcp_servers import check_uses, parse_mcp_servers
from workers.persona.tool_config import McpDecl, McpServer, PythonDecl
from workers.settings import Settings

FULL = """
[[tools.mcp]]
name = "time"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
env = { TZ = "UTC" }
allow = ["get_current_time"]
timeout = "30s"

[[tools.python]]
ref = "mypkg.tools:weather_tool"

[[tools.mcp]]
name = "search"
url = "https://mcp.example.com/mcp"
headers = { Authorization = "Bearer ${TOKEN}" }

[[tools.mcp]]
use = "github"
allow = ["search_issues"]
"""


def _error(text: str) -> PersonaConfigError:
    with pytest.raises(PersonaConfigError) as caught:
        parse_manifest(text, source=Path("/p/ava/persona.toml"))
    return caught.value


def test_the_pinned_example_parses_in_file_order() -> None:
    """Every documented key parses, and the declarations keep the order of the file, including
    how [[tools.mcp]] and [[tools.python]] interleave."""
    tools = parse_manifest(FULL).tools
    assert [type(decl).__name__ for decl in tools.entries] == [
        "McpDecl",
        "PythonDecl",
        "McpDecl",
        "McpDecl",
    ]
    time, weather, search, github = tools.entries
    assert time == McpDecl(
        key="tools.mcp[0]",
        name="time",
        server=McpServer(
            "stdio",
            command="mcp-server-time",
            args=("--local-timezone", "UTC"),
            env=(("TZ", "UTC"),),
        ),
        use=None,
        allow=("get_current_time",),
        timeout=30.0,
    )
    assert weather == PythonDecl("tools.python[0]", "mypkg.tools:weather_tool", None)
    assert isinstance(search, McpDecl)
    assert search.server == McpServer(
        "http",
        url="https://mcp.example.com/mcp",
        headers=(("Authorization", "Bearer ${TOKEN}"),),
    )
    assert isinstance(github, McpDecl)
    assert (github.name, github.use, github.server) == ("github", "github", None)


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('[[tools.mcp]]\nname = "t"\n', "tools.mcp[0].command", "is missing"),
        (
            '[[tools.mcp]]\nname = "t"\ncommand = "x"\nallowed = ["a"]\n',
            "tools.mcp[0].allowed",
            "not a known key",
        ),
        ('[[tools.mcp]]\ncommand = "x"\n', "tools.mcp[0].name", "is missing"),
        ('[[tools.mcp]]\nname = "a__b"\ncommand = "x"\n', "tools.mcp[0].name", "single '_'"),
        (
            '[[tools.mcp]]\nname = "t"\ncommand = "x"\nurl = "http://h/mcp"\n',
            "tools.mcp[0].url",
            "cannot be combined",
        ),
        ('[[tools.mcp]]\nname = "t"\nurl = "ftp://h"\n', "tools.mcp[0].url", "http://"),
        (
            '[[tools.mcp]]\nname = "t"\nurl = "http://h/mcp"\nargs = ["a"]\n',
            "tools.mcp[0].args",
            "stdio",
        ),
        (
            '[[tools.mcp]]\nname = "t"\ncommand = "x"\ntimeout = 30\n',
            "tools.mcp[0].timeout",
            "duration",
        ),
        (
            '[[tools.mcp]]\nname = "t"\ncommand = "x"\nenv = { "1X" = "a" }\n',
            "tools.mcp[0].env.1X",
            "environment variable",
        ),
        (
            '[[tools.mcp]]\nname = "t"\ncommand = "x"\nallow = "a"\n',
            "tools.mcp[0].allow",
            "list of strings",
        ),
        (
            '[[tools.mcp]]\nname = "t"\ncommand = "x"\n[[tools.mcp]]\nname = "t"\ncommand = "y"\n',
            "tools.mcp[1].name",
            "tools.mcp[0]",
        ),
        ('[[tools.mcp]]\nuse = "t"\ncommand = "x"\n', "tools.mcp[0].command", "not a known key"),
        ("[[tools.python]]\n", "tools.python[0].ref", "is missing"),
        ('[[tools.python]]\nref = "no colon"\n', "tools.python[0].ref", "package.module:attribute"),
        ('[[tools.native]]\nref = "a:b"\n', "tools.native", "not a known key"),
        ('tools = "all"\n', "tools", "must be a table"),
    ],
)
def test_bad_tool_config_names_the_key_and_the_file(text: str, key: str, words: str) -> None:
    """Unknown keys, missing command, bad names, timeouts and refs: each names key and file."""
    error = _error(text)
    assert error.key == key
    assert words in error.problem
    assert "/p/ava/persona.toml" in str(error)


def test_an_invalid_tool_config_makes_the_persona_invalid(tmp_path: Path) -> None:
    """load_manifest (what the registry sync and every turn read) refuses the file."""
    (tmp_path / "persona.toml").write_text('[[tools.mcp]]\nname = "t"\nargs = ["x"]\n')
    with pytest.raises(PersonaConfigError, match=r"persona.toml: key 'tools.mcp\[0\].command'"):
        load_manifest(tmp_path)


FLEET = """{"mcpServers": {
  "time": {"command": ["mcp-server-time", "--local-timezone", "UTC"], "environment": {"TZ": "UTC"}},
  "search": {"type": "remote", "url": "https://mcp.example.com/mcp", "timeout": 20000},
  "off": {"command": "x", "disabled": true}
}}"""


def test_the_fleet_file_reads_the_common_mcpservers_shape() -> None:
    """argv-list commands, environment alias, type, ms timeouts and disabled servers."""
    servers = parse_mcp_servers(FLEET)
    assert servers["time"].server == McpServer(
        "stdio", command="mcp-server-time", args=("--local-timezone", "UTC"), env=(("TZ", "UTC"),)
    )
    assert servers["search"].server.url == "https://mcp.example.com/mcp"
    assert servers["search"].timeout == 20.0
    assert servers["off"].enabled is False


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[]", "JSON object"),
        ('{"mcpServers": {"t": {"comand": "x"}}}', "mcpServers.t.comand: is not a known key"),
        ('{"mcpServers": {"t": {"type": "remote", "command": "x"}}}', "mcpServers.t.type"),
        ('{"mcpServers": {"t": {"command": "x", "timeout": -1}}}', "mcpServers.t.timeout"),
        ('{"mcpServers": {"a b": {"command": "x"}}}', "not a usable server name"),
        ("{nope", "not valid JSON"),
    ],
)
def test_a_bad_fleet_file_names_the_variable_and_the_server(text: str, words: str) -> None:
    """A typo in the fleet file stops the process at start-up, naming SOULFLEET_MCP_CONFIG."""
    with pytest.raises(SettingsError) as caught:
        parse_mcp_servers(text, source="/etc/mcp.json")
    assert caught.value.variable == "SOULFLEET_MCP_CONFIG"
    assert words in str(caught.value)


def test_settings_read_the_fleet_file_once(tmp_path: Path) -> None:
    """SOULFLEET_MCP_CONFIG is parsed by Settings.from_env; a missing file names the variable."""
    path = tmp_path / "mcp.json"
    path.write_text(FLEET)
    settings = Settings.from_env({"SOULFLEET_MCP_CONFIG": str(path)})
    assert settings.mcp_config == path
    assert sorted(settings.mcp_servers) == ["off", "search", "time"]
    with pytest.raises(SettingsError, match=r"SOULFLEET_MCP_CONFIG .*cannot be read"):
        Settings.from_env({"SOULFLEET_MCP_CONFIG": str(tmp_path / "missing.json")})


def test_a_use_of_an_unknown_fleet_server_is_an_invalid_persona() -> None:
    """``use`` must name a server of the fleet file; the error lists the ones there are."""
    tools = parse_manifest(
        '[[tools.mcp]]\nuse = "github"\n', source=Path("/p/ava/persona.toml")
    ).tools
    with pytest.raises(PersonaConfigError) as caught:
        check_uses(tools, parse_mcp_servers(FLEET))
    assert caught.value.key == "tools.mcp[0].use"
    assert "known: off, search, time" in caught.value.problem
    check_uses(parse_manifest('[[tools.mcp]]\nuse = "time"\n').tools, parse_mcp_servers(FLEET))


def test_server_env_and_headers_never_show_in_a_repr(tmp_path: Path) -> None:
    """Tokens in env or headers stay out of reprs (Settings, tracebacks, logs)."""
    path = tmp_path / "mcp.json"
    path.write_text(
        '{"mcpServers": {"a": {"url": "https://h/mcp", "headers": {"Authorization": '
        '"Bearer tok1"}}, "b": {"command": "x", "env": {"KEY": "tok2"}}}}'
    )
    settings = Settings.from_env({"SOULFLEET_MCP_CONFIG": str(path)})
    shown = repr(settings)
    assert "https://h/mcp" in shown
    assert "tok1" not in shown
    assert "tok2" not in shown


def test_the_inline_use_form_of_the_issue_parses() -> None:
    """``tools.mcp = [{ use = "time" }]`` (inline arrays) is the same as ``[[tools.mcp]]``."""
    tools = parse_manifest(
        'tools.mcp = [{ use = "time" }, { use = "search", allow = ["find"] }]\n'
        'tools.python = [{ ref = "pkg.mod:tool" }]\n'
    ).tools
    assert [(type(d).__name__, d.key) for d in tools.entries] == [
        ("McpDecl", "tools.mcp[0]"),
        ("McpDecl", "tools.mcp[1]"),
        ("PythonDecl", "tools.python[0]"),
    ]
    first = tools.entries[0]
    assert isinstance(first, McpDecl)
    assert (first.name, first.use) == ("time", "time")


@pytest.mark.parametrize(
    ("env", "headers"),
    [
        ('{ GITHUB_TOKEN = "ghp_tok3_secret", DEBUG = 1 }', None),
        (None, '{ Authorization = "Bearer tok4_secret", Retries = true }'),
        (None, '"Authorization: Bearer tok4_secret"'),
    ],
)
def test_a_bad_env_or_headers_table_never_shows_its_values(
    tmp_path: Path, env: str | None, headers: str | None
) -> None:
    """A mistyped value beside a token (``DEBUG = 1``) is an error naming the key, never one
    quoting the whole table: the error is logged, kept as the lane's last error and shown by
    ``status`` and ``up``, and the token beside the typo went with it."""
    if env is not None:
        body = f'command = "x"\nenv = {env}\n'
    else:
        body = f'url = "https://h/mcp"\nheaders = {headers}\n'
    (tmp_path / "persona.toml").write_text(f'[[tools.mcp]]\nname = "gh"\n{body}')
    with pytest.raises(PersonaConfigError) as caught:
        load_manifest(tmp_path)
    shown = str(caught.value)
    assert "tools.mcp[0]." in shown
    assert "tok3_secret" not in shown
    assert "tok4_secret" not in shown


@pytest.mark.parametrize(
    "server",
    [
        '{"command": "x", "env": {"GITHUB_TOKEN": "ghp_tok5_secret", "PORT": 8080}}',
        '{"url": "https://h/mcp", "headers": "Authorization: Bearer tok6_secret"}',
    ],
)
def test_a_bad_fleet_file_env_never_shows_its_values(tmp_path: Path, server: str) -> None:
    """The fleet file (the Claude Desktop shape, where tokens are often written literally):
    a worker refusing it at start-up prints the error, never the tokens beside the typo."""
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"gh": ' + server + "}}")
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"SOULFLEET_MCP_CONFIG": str(path)})
    shown = str(caught.value)
    assert "mcpServers.gh." in shown
    assert "tok5_secret" not in shown
    assert "tok6_secret" not in shown

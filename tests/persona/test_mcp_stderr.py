"""mcp_stderr.py: a stdio MCP server's stderr reaches ours with the worker's secrets masked."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workers.persona import mcp_stderr
from workers.persona.manifest import parse_manifest
from workers.persona.mcp_hub import McpHub
from workers.persona.mcp_stderr import MAX_LINE, StderrRelay, secrets_for
from workers.persona.mcp_transport import referenced
from workers.persona.toolbox import Toolbox, ToolLimits, build_declared

KEY = "sk-TESTSECRETkey0123456789"


def _through_hub(tmp_path: Path, toml: str, start_timeout: float = 30) -> tuple[Toolbox, str]:
    """``toml``'s MCP servers started through a hub, as a turn starts them: the turn's
    toolbox, and what reached the worker's stderr meanwhile."""
    log = tmp_path / "worker-stderr.txt"
    with log.open("w", encoding="utf-8") as errlog:
        hub = McpHub(start_timeout=start_timeout, errlog=errlog)
        try:
            config = parse_manifest(toml, source=Path("persona.toml"))
            box = build_declared(config.tools, hub=hub, limits=ToolLimits())
        finally:
            hub.close()
    return box, log.read_text()


def test_the_secrets_are_what_var_carried_and_what_secret_names_hold() -> None:
    """${VAR} values the server was given, values of *KEY*/*TOKEN*/*PASSWORD* variables and a
    password inside a URL are secrets; short values and ordinary variables are not."""
    environ = {
        "MY_TOKEN_SOURCE": "tok-abcdef-123456",
        "PLAIN": "not-a-secret-value",
        "OPENAI_API_KEY": KEY,
        "REDIS_URL": "redis://:p%40ss-word-1@db:6379/0",
        "DB_PASS": "hunter2-long",
        "SHORT_KEY": "abc",
    }
    found = secrets_for(referenced(["Bearer ${MY_TOKEN_SOURCE}", "plain"]), environ)
    basic = base64.b64encode(b":p@ss-word-1").decode()  # the URL's password as Basic auth
    assert set(found) == {
        "tok-abcdef-123456", KEY, "p%40ss-word-1", "p@ss-word-1", basic, "hunter2-long",
    }  # fmt: skip
    assert found == sorted(found, key=len, reverse=True)


def test_a_server_printing_its_environment_has_the_secrets_masked(tmp_path: Path) -> None:
    """A child writing a token and its whole environment to stderr: every line reaches our
    stderr prefixed with the server's name, the token masked wherever it appears."""
    out_path = tmp_path / "stderr.txt"
    with out_path.open("w", encoding="utf-8") as out:
        relay = StderrRelay("leaky", [KEY], out)
        script = "import os, sys; print('LEAKED-' + os.environ['TOKEN'], file=sys.stderr)"
        subprocess.run([sys.executable, "-c", script], env={"TOKEN": KEY}, stderr=relay.writer,
                       check=True)  # fmt: skip
        relay.close()
        relay.join(timeout=10)
    text = out_path.read_text()
    assert "[mcp leaky] LEAKED-***" in text
    assert KEY not in text


def test_a_line_without_end_is_dropped_with_a_notice_not_held_or_cut(tmp_path: Path) -> None:
    """A server writing 1 MiB with no newline, the key at its middle, then a short line: the
    long one is dropped with a notice giving its size (held whole it grew the worker's memory
    without bound; relayed in pieces, a key cut at a piece's edge would escape the mask); the
    short one still comes through, masked."""
    out_path = tmp_path / "stderr.txt"
    with out_path.open("w", encoding="utf-8") as out:
        relay = StderrRelay("noisy", [KEY], out)
        script = (
            "import sys; half = 'x' * (512 * 1024); "
            "sys.stderr.write(half + sys.argv[1] + half + '\\n'); "
            "sys.stderr.write('after ' + sys.argv[1] + '\\n')"
        )
        subprocess.run([sys.executable, "-c", script, KEY], stderr=relay.writer, check=True)
        relay.close()
        relay.join(timeout=10)
    lines = out_path.read_text().splitlines()
    assert lines == [
        f"[mcp noisy] (a line of {2 * 512 * 1024 + len(KEY) + 1:,} bytes, over "
        f"{MAX_LINE:,}, was dropped)",
        "[mcp noisy] after ***",
    ]


@pytest.mark.integration
def test_a_persona_mcp_server_cannot_write_the_api_key_into_the_worker_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the hub, as a turn starts it: a server given ${OPENAI_API_KEY} that echoes it and
    its environment to stderr and exits is named unavailable, and the worker's stderr holds its
    lines with the key masked."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    toml = (
        '[[tools.mcp]]\nname = "leak"\ncommand = "sh"\n'
        'args = ["-c", "echo LEAKED-$TOKEN >&2; env >&2; exit 3"]\n'
        'env = { TOKEN = "${OPENAI_API_KEY}" }\n'
    )
    box, text = _through_hub(tmp_path, toml)
    assert box.tools == ()
    assert box.unavailable
    assert "[mcp sh] LEAKED-***" in text
    assert "TOKEN=***" in text
    assert KEY not in text


@pytest.mark.integration
def test_a_token_written_literally_in_a_server_env_is_masked_too(tmp_path: Path) -> None:
    """The fleet file's common shape (Claude Desktop's) writes tokens literally:
    ``"env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_..."}``. A server printing its environment
    must not carry that token into the worker's log any more than a ``${VAR}`` one."""
    literal = "ghp_LITERALtoken0123456789"
    toml = (
        '[[tools.mcp]]\nname = "leak"\ncommand = "sh"\n'
        'args = ["-c", "env >&2; exit 3"]\n'
        f'env = {{ GITHUB_PERSONAL_ACCESS_TOKEN = "{literal}", TZ = "UTC" }}\n'
    )
    box, text = _through_hub(tmp_path, toml)
    assert box.unavailable
    assert "GITHUB_PERSONAL_ACCESS_TOKEN=***" in text
    assert "TZ=UTC" in text
    assert literal not in text


def test_a_flood_of_lines_is_rate_limited_with_a_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server printing in a loop wrote 190,000 lines into the worker's log within seconds
    (a log disk filled by one server): past BURST_LINES at once (then LINES_PER_SECOND) the
    lines are dropped and counted in one notice; the last line is still kept for errors."""
    monkeypatch.setattr(mcp_stderr, "BURST_LINES", 5)
    out_path = tmp_path / "stderr.txt"
    with out_path.open("w", encoding="utf-8") as out:
        relay = StderrRelay("flood", [KEY], out)
        script = "import sys\nfor i in range(5000): print('line', i, file=sys.stderr)"
        subprocess.run([sys.executable, "-c", script], stderr=relay.writer, check=True)
        relay.close()
        relay.join(timeout=10)
    lines = out_path.read_text().splitlines()
    assert len(lines) < 100
    assert lines[:5] == [f"[mcp flood] line {i}" for i in range(5)]
    assert lines[-1].startswith("[mcp flood] (")
    assert "lines dropped: over 10 lines a second" in lines[-1]
    assert relay.last_line == "line 4999"


def test_under_json_logging_each_line_is_one_json_object(tmp_path: Path) -> None:
    """With SOULFLEET_LOG_FORMAT=json every line of the log is one JSON object, but a
    server's stderr came through as plain text (and `jq 'fromjson?'` dropped it): it is an
    ``mcp.stderr`` event naming the server, masked as before."""
    out_path = tmp_path / "stderr.txt"
    mcp_stderr.set_json_lines(True)
    try:
        with out_path.open("w", encoding="utf-8") as out:
            relay = StderrRelay("jsonny", [KEY], out)
            script = "import sys; print('token ' + sys.argv[1], file=sys.stderr)"
            subprocess.run([sys.executable, "-c", script, KEY], stderr=relay.writer, check=True)
            relay.close()
            relay.join(timeout=10)
    finally:
        mcp_stderr.set_json_lines(False)
    [line] = out_path.read_text().splitlines()
    record = json.loads(line)
    assert (record["event"], record["server"], record["line"]) == (
        "mcp.stderr",
        "jsonny",
        "token ***",
    )


@pytest.mark.integration
def test_lines_on_stdout_that_are_not_json_rpc_are_one_masked_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server printing a start-up banner on stdout (the protocol's channel) got the SDK's
    full pydantic traceback per line in the worker's log, its text unmasked: each such line is
    one line through the server's relay, named and masked (JSON that is no JSON-RPC message
    shown as it parsed), a line that is not UTF-8 no longer ends the session at start, and the
    server's tools come up."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server = Path(__file__).parents[1] / "support" / "mcp_server.py"
    script = tmp_path / "chatty.sh"
    script.write_bytes(
        b'echo "Starting chatty v1 key=$TOKEN"\n'
        b"echo '{\"hello\": 1}'\n"
        b"printf 'caf\\351\\n'\n" + f"exec {sys.executable} {server}\n".encode()
    )
    toml = (
        f'[[tools.mcp]]\nname = "chatty"\ncommand = "sh"\nargs = ["{script}"]\n'
        'env = { TOKEN = "${OPENAI_API_KEY}" }\n'
    )
    box, text = _through_hub(tmp_path, toml, start_timeout=60)
    assert "chatty__echo" in {tool.name for tool in box.tools}
    assert "[mcp sh] ignored a line on stdout that is not JSON-RPC" in text
    assert "'Starting chatty v1 key=***'" in text
    assert """'{"hello": 1}'""" in text  # JSON, but no JSON-RPC message: shown as it parsed
    assert "'caf\ufffd'" in text  # not UTF-8: replaced, and the server still comes up
    assert KEY not in text + caplog.text
    assert "Traceback" not in text + caplog.text
    assert "Failed to parse JSONRPC" not in caplog.text

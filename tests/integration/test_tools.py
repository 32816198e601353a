"""Persona tools through real workers: MCP servers and Python tools declared in persona.toml.

The model is the scripted model (an in-repo fake of a paid model) told by rules to call a tool
and answer with its result; everything else is real: celery worker processes, Redis, a real
third-party MCP server from PyPI (``mcp-server-time``) and the SDK-written test server.
"""

from __future__ import annotations

import sys
import threading
from datetime import UTC, datetime

import pytest

from tests.integration.conftest import Harness
from tests.support.fleet import post_past_the_door, settled, wait_until
from tests.support.mcp_helpers import SERVER_SCRIPT, new_tag, tagged_pids, wait_gone
from workers.persona.errors import PersonaConfigError
from workers.persona.transcripts import FileTranscripts

pytestmark = pytest.mark.integration

TIME_RULES = """
[[rules]]
name = "ask the clock"
when = { tool = "time__get_current_time", tool_results = 0 }
calls = [{ tool = "time__get_current_time", args = { timezone = "UTC" } }]

[[rules]]
name = "answer"
when = { tool_results = 1 }
text = "The clock says: {tool_result}"
"""


def test_a_persona_uses_a_pypi_mcp_server_through_a_real_worker(harness: Harness) -> None:
    """mcp-server-time (from PyPI) declared in persona.toml: the model calls it, the result
    reaches the model, the transcript records call and result, the worker logs ``tool.call``,
    and stopping the worker stops the server."""
    tag = new_tag()
    home = harness.persona(
        "clock",
        rules=TIME_RULES,
        toml=(
            '[[tools.mcp]]\nname = "time"\ncommand = "mcp-server-time"\n'
            'args = ["--local-timezone", "UTC"]\n'
            f'env = {{ SOULFLEET_TEST_TAG = "{tag}" }}\n'
            'allow = ["get_current_time"]\ntimeout = "60s"\n'
        ),
    )
    worker = harness.worker()
    reply = harness.fleet.run("clock", "What time is it?", timeout=240)
    assert reply.status == "done"
    assert reply.text.startswith("The clock says: ")
    assert '"timezone": "UTC"' in reply.text
    assert datetime.now(UTC).strftime("%Y-%m-%d") in reply.text

    # A transcript is a session's (issue 11): this turn is the first of the clock's session.
    records = FileTranscripts(home).messages(harness.fleet.session("clock")["id"])
    calls = [call for r in records for call in r.message.tool_calls]
    assert [(c.name, dict(c.arguments)) for c in calls] == [
        ("time__get_current_time", {"timezone": "UTC"})
    ]
    [result] = [r.message for r in records if r.message.role == "tool"]
    assert result.name == "time__get_current_time"
    assert not result.is_error
    assert '"timezone": "UTC"' in result.content

    [event] = harness.events("tool.call", tool="time__get_current_time")
    assert (event["persona"], event["source"], event["outcome"]) == ("clock", "mcp", "ok")
    assert event["result_bytes"] == len(result.content.encode())

    assert len(tagged_pids(tag)) == 1
    worker.stop()
    assert worker.popen.returncode is not None
    wait_gone(tag)
    assert tagged_pids(tag) == []


ECHO_RULES = """
[[rules]]
when = { tool_results = 0, user_regex = 'hello from (p[0-9]+)' }
calls = [{ tool = "t__whoami", args = {} }, { tool = "t__echo", args = { text = "{match}" } }]

[[rules]]
when = { tool_results = 2 }
text = "{last_tool_result}"
"""


def test_fifty_concurrent_turns_share_one_server_session(harness: Harness) -> None:
    """50 personas declaring the same server run 50 turns at once on one worker: one server
    process, one session start, and every turn gets its own answer."""
    tag = new_tag()
    toml = (
        f'[[tools.mcp]]\nname = "t"\ncommand = "{sys.executable}"\n'
        f'args = ["{SERVER_SCRIPT}", "--tag", "{tag}"]\ntimeout = "120s"\n'
    )
    names = [f"p{n:02d}" for n in range(50)]
    for name in names:
        harness.persona(name, rules=ECHO_RULES, toml=toml)
    worker = harness.worker(concurrency=50)
    replies: dict[str, str] = {}

    def ask(name: str) -> None:
        replies[name] = harness.fleet.run(name, f"hello from {name}", timeout=300).text

    threads = [threading.Thread(target=ask, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(320)
    assert replies == {name: f'{{"result": "{name}"}}' for name in names}
    whoami = harness.events("tool.call", tool="t__whoami")
    assert len(whoami) == 50
    assert {e["outcome"] for e in whoami} == {"ok"}
    assert len(worker.events("mcp.started")) == 1
    assert len(tagged_pids(tag)) == 1
    starts = [e for e in harness.events("turn.start") if e["lane"] in names]
    ends = [e for e in harness.events("turn.end") if e["lane"] in names]
    # Real concurrency: many turns had started before the first one ended.
    first_end = min(float(e["at"]) for e in ends)
    assert sum(1 for s in starts if float(s["at"]) < first_end) >= 10
    worker.stop()
    wait_gone(tag)
    assert tagged_pids(tag) == []


def test_python_tools_by_ref_and_an_invalid_ref(harness: Harness) -> None:
    """A Python tool by ref answers through the worker; a bad ref makes that persona's turn
    fail with the key and reason (dead-lettered, status says why); a server that cannot start
    only leaves its tools out of the turn."""
    harness.configure(SOULFLEET_MAX_ATTEMPTS="1")
    harness.persona(
        "loud",
        rules=(
            '[[rules]]\nwhen = { tool_results = 0, user_regex = "say: (.*)" }\ncalls = [{ tool '
            '= "shout", args = { text = "{match}" } }]\n[[rules]]\ntext = "{tool_result}"\n'
        ),
        toml='[[tools.python]]\nref = "tests.support.python_tools:shout"\n',
    )
    harness.persona(
        "broken",
        rules='[[rules]]\ntext = "never"\n',
        toml='[[tools.python]]\nref = "tests.support.no_such_module:tool"\n',
    )
    harness.persona(
        "lonely",
        rules='[[rules]]\ntext = "fine without it"\n',
        toml='[[tools.mcp]]\nname = "gone"\ncommand = "no-such-mcp-server-here"\n',
    )
    harness.worker(concurrency=4)
    assert harness.fleet.run("loud", "say: quiet please", timeout=120).text == "QUIET PLEASE"
    assert harness.fleet.run("lonely", "hello", timeout=120).text == "fine without it"
    [missing] = harness.events("tool.server_unavailable", persona="lonely")
    assert "not found on PATH" in missing["error"]

    # Refused at the door, the key named; queued behind it, the worker's turn fails the same.
    with pytest.raises(PersonaConfigError, match=r"tools\.python\[0\]\.ref"):
        harness.fleet.post("broken", "hello", wake=True)
    settled(harness.root / "broken")  # broken, not being edited: dead-lettered at once
    post_past_the_door(harness.fleet, "broken", "hello")
    wait_until(lambda: harness.fleet.status("broken")["state"] == "dead", timeout=120, what="dead")
    error = str(harness.fleet.status("broken")["last_error"])
    assert "tools.python[0].ref" in error
    assert "cannot import module 'tests.support.no_such_module'" in error
    assert "persona.toml" in error


MISBEHAVE_RULES = """
[[rules]]
when = { tool_results = 0 }
calls = [
  { tool = "t__sleep", args = { seconds = 600 } },
  { tool = "t__crash", args = {} },
  { tool = "t__whoami", args = {} },
]

[[rules]]
when = { tool_results = 3 }
text = "after {tool_results} results: {last_tool_result}"
"""


def test_a_misbehaving_server_never_fails_or_hangs_a_turn(harness: Harness) -> None:
    """Through a real worker: a tool that sleeps past its timeout and one that crashes its
    server are error results the model sees; the next call runs on a restarted server; the turn
    ends done, and stopping the worker leaves no server process."""
    tag = new_tag()
    home = harness.persona(
        "shaky",
        rules=MISBEHAVE_RULES,
        toml=(
            f'[[tools.mcp]]\nname = "t"\ncommand = "{sys.executable}"\n'
            f'args = ["{SERVER_SCRIPT}", "--tag", "{tag}"]\ntimeout = "3s"\n'
        ),
    )
    worker = harness.worker()
    reply = harness.fleet.run("shaky", "go", timeout=240)
    assert reply.status == "done"
    assert reply.text.startswith('after 3 results: {"result": "pid=')
    results = [
        r.message
        for r in FileTranscripts(home).messages(harness.fleet.session("shaky")["id"])
        if r.message.role == "tool"
    ]
    assert [(m.name, m.is_error) for m in results] == [
        ("t__sleep", True),
        ("t__crash", True),
        ("t__whoami", False),
    ]
    assert "did not answer within its 3s timeout" in results[0].content
    assert "restarted for a later call" in results[1].content
    calls = harness.events("tool.call", persona="shaky")
    assert [e["outcome"] for e in calls] == ["timeout", "server_died", "ok"]
    # The timeout, plus slack for a loaded machine: neither call waited on the server for long.
    assert max(e["seconds"] for e in calls[:2]) < 3 + 10
    assert len(worker.events("mcp.started")) == 2
    worker.stop()
    wait_gone(tag)
    assert tagged_pids(tag) == []

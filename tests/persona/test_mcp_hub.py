"""MCP servers through the hub, as a turn uses them: a real server written with the SDK (stdio
and streamable HTTP) that sleeps, crashes mid-call, returns 5 MB and raises.

Each misbehaviour must come back as an error result within the call's timeout, the server must
serve the next call (restarted when it died), and no server process may outlive the hub.
Processes are counted from /proc by a tag unique to the test.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
import structlog.testing

from tests.support.fleet import wait_until
from tests.support.mcp_helpers import (
    SERVER_SCRIPT,
    http_test_server,
    new_tag,
    tagged_pids,
    wait_gone,
)
from workers.persona import waits
from workers.persona.manifest import parse_manifest
from workers.persona.mcp_hub import McpHub
from workers.persona.tool_config import McpServer
from workers.persona.toolbox import Toolbox, ToolLimits, build_declared
from workers.persona.tools import Tool

pytestmark = pytest.mark.integration

# Python MCP servers take seconds to start on a loaded machine; calls are bounded separately.
START = 120.0


@pytest.fixture
def hub() -> Iterator[McpHub]:
    hub = McpHub(start_timeout=START)
    try:
        yield hub
    finally:
        hub.close()


def _box(hub: McpHub, toml: str, limits: ToolLimits | None = None) -> Toolbox:
    config = parse_manifest(toml, source=Path("persona.toml"))
    return build_declared(config.tools, hub=hub, limits=limits or ToolLimits())


def _stdio(tag: str, timeout: str = "6s") -> str:
    return (
        f'[[tools.mcp]]\nname = "t"\ncommand = "{sys.executable}"\n'
        f'args = ["{SERVER_SCRIPT}", "--tag", "{tag}"]\ntimeout = "{timeout}"\n'
    )


def _patient(server: str) -> str:
    """The same server again under another prefix with a long timeout: moving 5 MB through
    JSON on a loaded machine may take longer than the short timeout the other calls test. One
    server config, so one session: the two declarations share it."""
    return f'[[tools.mcp]]\nname = "b"\n{server}allow = ["big"]\ntimeout = "120s"\n'


def _tools(box: Toolbox) -> dict[str, Tool]:
    return {tool.name: tool for tool in box.tools}


def _pid(tools: dict[str, Tool]) -> str:
    result = tools["t__whoami"].execute({})
    assert not result.is_error, result.output
    return result.output.split("pid=")[1].split()[0]


def _timed(tool: Tool, arguments: dict[str, object]) -> tuple[float, str, bool, str | None]:
    started = time.monotonic()
    result = tool.execute(arguments)
    return time.monotonic() - started, result.output, result.is_error, result.failure


def _misbehave(tools: dict[str, Tool], restarted: object) -> None:
    """The shared script: sleep, 5 MB, raise, crash; the server keeps serving after each."""
    first = _pid(tools)

    seconds, output, is_error, failure = _timed(tools["t__sleep"], {"seconds": 60})
    assert (is_error, failure) == (True, "timeout")
    assert "6s timeout" in output
    assert seconds < 6 + 6  # the timeout, plus scheduling slack on a loaded machine
    assert _pid(tools) == first  # a slow tool is not a dead server: same process, same session

    seconds, output, is_error, failure = _timed(tools["b__big"], {"megabytes": 5})
    assert (is_error, failure) == (True, "too_large")
    assert "131,072 byte cap" in output
    assert "5,242,8" in output
    assert len(output) < 1000

    seconds, output, is_error, failure = _timed(tools["t__fail"], {"message": "boom"})
    assert (is_error, failure) == (True, "tool_error")
    assert seconds < 6 + 6

    seconds, output, is_error, failure = _timed(tools["t__crash"], {})
    assert (is_error, failure) == (True, "server_died"), output
    assert "restarted for a later call" in output
    assert seconds < 6 + 6
    if callable(restarted):
        restarted()
    second = _pid(tools)
    assert second != first  # a new server process answered the next call


def test_stdio_server_failures_are_error_results_and_the_server_comes_back(hub: McpHub) -> None:
    """Over stdio: a sleeping tool times out, a 5 MB result is refused naming the cap, a raising
    tool is an error, a crash mid-call is an error and the next call starts a new server; at
    close no server process is left."""
    tag = new_tag()
    assert tagged_pids(tag) == []
    server = f'command = "{sys.executable}"\nargs = ["{SERVER_SCRIPT}", "--tag", "{tag}"]\n'
    tools = _tools(_box(hub, _stdio(tag) + _patient(server)))
    assert list(tools) == [
        "t__echo",
        "t__whoami",
        "t__sleep",
        "t__crash",
        "t__big",
        "t__fail",
        "b__big",
    ]
    _misbehave(tools, restarted=None)
    assert len(tagged_pids(tag)) == 1  # the crashed one is gone, its successor runs
    hub.close()
    wait_gone(tag)
    assert tagged_pids(tag) == []


def test_http_server_failures_are_error_results_and_the_session_comes_back(hub: McpHub) -> None:
    """Over streamable HTTP, the same: each failure is an error result within the timeout, and
    after the (supervised) server restarts, the next call opens a new session to it."""
    tag = new_tag()
    with http_test_server(tag) as http:
        server = f'url = "{http.url}"\n'
        toml = f'[[tools.mcp]]\nname = "t"\n{server}timeout = "6s"\n' + _patient(server)
        tools = _tools(_box(hub, toml))
        assert "t__crash" in tools
        _misbehave(tools, restarted=http.wait_ready)
        assert http.starts == 2
    wait_gone(tag)
    assert tagged_pids(tag) == []


def test_fifty_threads_share_one_session_and_each_gets_its_own_answer(hub: McpHub) -> None:
    """50 threads (a worker's pool) calling at once share one server process and one session,
    and every call gets its own answer back."""
    tag = new_tag()
    tools = _tools(_box(hub, _stdio(tag, timeout="60s")))
    echo = tools["t__echo"]
    results: dict[int, str] = {}
    barrier = threading.Barrier(50)

    def call(n: int) -> None:
        barrier.wait()
        results[n] = echo.execute({"text": f"n{n}"}).output

    threads = [threading.Thread(target=call, args=(n,)) for n in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == {n: f'{{"result": "n{n}"}}' for n in range(50)}
    assert hub.starts(tools["t__echo"].inner.server) == 1  # type: ignore[attr-defined]
    assert len(tagged_pids(tag)) == 1


def test_a_server_that_cannot_start_is_named_and_backed_off(hub: McpHub) -> None:
    """A missing command leaves the server out of the turn with the reason (not a config error);
    a call made meanwhile is a quick error result, not a new spawn attempt per call."""
    box = _box(hub, '[[tools.mcp]]\nname = "gone"\ncommand = "no-such-mcp-server-here"\n')
    assert box.tools == ()
    [(prefix, server, reason)] = box.unavailable
    assert (prefix, server) == ("gone", "no-such-mcp-server-here")
    assert "not found on PATH" in reason
    again = _box(hub, '[[tools.mcp]]\nname = "gone"\ncommand = "no-such-mcp-server-here"\n')
    assert "not found" in again.unavailable[0][2]


def test_a_command_written_with_its_arguments_says_to_put_them_in_args(hub: McpHub) -> None:
    """`command = "python3 -m server --flag"` (a shell line) was "not found on PATH" with no
    word of why: the first word is there, so the reason says to move the rest into args."""
    box = _box(hub, '[[tools.mcp]]\nname = "shell"\ncommand = "python3 -m some_server --v"\n')
    [(_, _, reason)] = box.unavailable
    assert "not found on PATH" in reason
    assert "'python3' is there: put its arguments in args" in reason
    assert "args = ['-m', 'some_server', '--v']" in reason


def test_a_server_that_dies_at_start_is_named_with_what_it_said_last(hub: McpHub) -> None:
    """A server that exits at start after printing a traceback: the reason quotes its last
    stderr line ("Connection closed" alone said nothing of why), with the worker's secrets
    masked as in every line it writes."""
    script = (
        "import sys; print('starting', file=sys.stderr); "
        "sys.exit('ModuleNotFoundError: No module named mcp_weather')"
    )
    box = _box(hub, f'[[tools.mcp]]\nname = "dies"\ncommand = "{sys.executable}"\n'
                    f'args = ["-c", "{script}"]\n')  # fmt: skip
    [(prefix, _, reason)] = box.unavailable
    assert prefix == "dies"
    assert "could not start" in reason
    assert "its stderr said last: 'ModuleNotFoundError: No module named mcp_weather'" in reason
    # The model calling its tool is told the server is unavailable, not what it printed (the
    # operator's to read: it may hold what no masking knows to hide).
    server = McpServer("stdio", command=sys.executable, args=("-c", script))
    outcome = hub.call(server, "forecast", {}, timeout=10.0)
    assert outcome.is_error
    assert "unavailable: could not start: MCPError: Connection closed." in outcome.output
    assert "stderr said" not in outcome.output


def test_a_killed_worker_takes_its_stdio_servers_with_it(tmp_path: Path) -> None:
    """A process holding a hub is SIGKILLed (no shutdown runs): its stdio server dies too."""
    tag = new_tag()
    script = tmp_path / "holder.py"
    script.write_text(
        "import sys, time\n"
        "from workers.persona.mcp_hub import McpHub\n"
        "from workers.persona.tool_config import McpServer\n"
        f"server = McpServer('stdio', command=sys.executable, args=({str(SERVER_SCRIPT)!r}, "
        f"'--tag', {tag!r}))\n"
        f"McpHub(start_timeout={START}).tools(server)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    try:
        assert holder.stdout is not None
        lines = iter(holder.stdout.readline, b"")
        assert any(line.strip() == b"ready" for line in lines)
        assert len(tagged_pids(tag)) == 1
        holder.kill()
        holder.wait(30)
        wait_until(lambda: not tagged_pids(tag), timeout=30, what="the server to die")
    finally:
        if holder.poll() is None:
            holder.kill()
    assert tagged_pids(tag) == []


def _hanging(name: str) -> str:
    """A stdio "server" that never answers initialize (it sleeps; one process per name)."""
    return (
        f'[[tools.mcp]]\nname = "{name}"\ncommand = "{sys.executable}"\n'
        f'args = ["-c", "import time; time.sleep(600)  # {name}"]\n'
    )


def test_servers_hanging_at_start_cost_a_turn_its_wait_not_each_start_budget() -> None:
    """Two servers that never finish starting, a turn that allows 2 s: the turn waits ~2 s for
    both together (side by side, not one start budget after the other), both are left out
    naming why, and their starts go on. Once those starts have failed, a turn that allows 20 s
    waits only the 2 s a server that failed before is given: a server hanging at every start
    costs each turn 2 s, not a start budget."""
    hub = McpHub(start_timeout=4.0)
    try:
        config = parse_manifest(_hanging("one") + _hanging("two"), source=Path("persona.toml"))
        began = time.monotonic()
        box = build_declared(config.tools, hub=hub, wait=2.0)
        took = time.monotonic() - began
        assert box.tools == ()
        assert [prefix for prefix, _, _ in box.unavailable] == ["one", "two"]
        assert all("still starting after 2s" in reason for _, _, reason in box.unavailable)
        assert took < 2.0 + 1.5  # both at once: not 4 s, not 8
        # Listings see the first starts fail at their 4 s budget (then the hung processes'
        # teardown): each waits the start's budget at most meanwhile.
        deadline = time.monotonic() + 30.0
        reasons = ["not listed yet"]
        while not all("did not start within 4s" in reason for reason in reasons):
            assert time.monotonic() < deadline, reasons
            began = time.monotonic()
            listed = build_declared(config.tools, hub=hub, wait=20.0)
            reasons = [reason for _, _, reason in listed.unavailable]
            assert time.monotonic() - began < 4.0 + 1.5
        began = time.monotonic()
        again = build_declared(config.tools, hub=hub, wait=20.0)
        took = time.monotonic() - began
        assert [prefix for prefix, _, _ in again.unavailable] == ["one", "two"]
        assert all("still starting after 2s" in reason for _, _, reason in again.unavailable)
        assert took < 2.0 + 1.5
    finally:
        hub.close()


def test_closing_while_a_server_starts_is_no_failure_to_report() -> None:
    """`soulfleet tools` (or a stopping worker) closes its hub while a server still starts:
    that start is given up, and no "could not start: CancelledError" warning follows the
    "still starting" reason the caller was given (a new user read it as a second failure)."""
    hub = McpHub(start_timeout=30.0)
    config = parse_manifest(_hanging("slow"), source=Path("persona.toml"))
    with structlog.testing.capture_logs() as logs:
        try:
            box = build_declared(config.tools, hub=hub, wait=1.0)
            assert "still starting after 1s" in box.unavailable[0][2]
        finally:
            hub.close()
    assert [e for e in logs if e["event"] == "mcp.down"] == []


def test_closing_while_a_failed_start_is_torn_down_stops_the_server_and_its_children() -> None:
    """A server that never answers, with a child of its own, given up at its start budget just
    as the caller gives up waiting (`soulfleet tools` waits the whole budget): the hub closed
    at that moment cancelled the SDK's teardown, so close waited its 15 s limit and the
    server's child outlived the process (one more orphan per `soulfleet tools`). Now close
    lets the teardown finish: quick, and nothing of the server is left."""
    tag = new_tag()
    toml = f'[[tools.mcp]]\nname = "kid"\ncommand = "sh"\nargs = ["-c", "sleep 600; : {tag}"]\n'
    hub = McpHub(start_timeout=2.0)
    try:
        config = parse_manifest(toml, source=Path("persona.toml"))
        box = build_declared(config.tools, hub=hub)
        assert "after 2s" in box.unavailable[0][2]
        assert tagged_pids(tag)
    finally:
        began = time.monotonic()
        hub.close()
        took = time.monotonic() - began
    assert took < 10.0
    wait_until(lambda: not tagged_pids(tag), timeout=10.0, what="the server and its child gone")


def test_a_call_waits_for_a_start_no_longer_than_its_timeout(hub: McpHub) -> None:
    """A tool whose server died and hangs on its restart: the next call is an error within the
    call's own timeout (the start included), not the hub's whole start budget."""
    server = McpServer("stdio", command=sys.executable,
                       args=("-c", "import time; time.sleep(600)"))  # fmt: skip
    began = time.monotonic()
    outcome = hub.call(server, "anything", {}, timeout=1.5)
    assert time.monotonic() - began < 1.5 + 3.0
    assert outcome.is_error
    assert outcome.failure == "unavailable"
    assert "still starting after 1.5s" in outcome.output


def test_a_call_after_a_crash_waits_for_the_restart_within_its_timeout(hub: McpHub) -> None:
    """A server whose every start takes ~3 s crashes mid-call: the next call (30 s timeout)
    waits for the restart and is answered. Only a server whose last START failed is given
    the short 2 s wait; a crash of a running one is not a failed start."""
    tag = new_tag()
    server = McpServer("stdio", command=sys.executable,
                       args=(str(SERVER_SCRIPT), "--tag", tag, "--start-delay", "3"))  # fmt: skip
    hub.tools(server)
    crashed = hub.call(server, "crash", {}, timeout=10)
    assert crashed.failure == "server_died"
    answered = hub.call(server, "echo", {"text": "back"}, timeout=30)
    assert not answered.is_error, answered.output
    assert "back" in answered.output


WEDGED = Path(__file__).resolve().parents[1] / "support" / "mcp_wedged_server.py"


def test_a_restart_of_a_wedged_server_leaves_one_server_running() -> None:
    """A wedged server (a tool that blocks its loop, SIGTERM ignored) is restarted; while the
    old runner still tears it down (the grace, then KILL) the next call starts its successor.
    The old runner's teardown leaves the successor's session alone (it cleared it: the next
    call started a third server and the second was orphaned for the worker's life)."""
    tag = new_tag()
    server = McpServer("stdio", command=sys.executable, args=(str(WEDGED), "--tag", tag))
    hub = McpHub(start_timeout=60)
    try:
        assert not hub.call(server, "whoami", {}, timeout=60).is_error
        assert hub.call(server, "wedge", {"seconds": 60}, timeout=1).failure == "timeout"
        time.sleep(1.5)  # its ping fails: the session is dropped, the old runner tears down
        assert not hub.call(server, "whoami", {}, timeout=60).is_error  # the successor
        time.sleep(6)  # the old runner's teardown ends (2 s grace, TERM ignored, KILL)
        assert not hub.call(server, "whoami", {}, timeout=60).is_error
        time.sleep(1)
        assert (len(tagged_pids(tag)), hub.starts(server)) == (1, 2)
    finally:
        hub.close()
    wait_gone(tag)


def test_starting_a_server_for_a_turn_is_a_wait(hub: McpHub) -> None:
    """Building a turn's tools waits for its MCP servers to start (seconds, on the hub's own
    thread): that wait runs inside the persona core's wait hook, so a worker's baton passes
    to other turns meanwhile instead of stalling them all."""
    entered: list[bool] = []

    @contextlib.contextmanager
    def hook(brief: bool) -> Iterator[None]:
        entered.append(brief)
        yield

    waits.set_wait_hook(hook)
    try:
        box = _box(hub, _stdio(new_tag()))
    finally:
        waits.set_wait_hook(None)
    assert any(tool.name.startswith("t") for tool in box.tools)
    assert False in entered  # a long wait


def test_an_allow_list_naming_a_tool_the_server_lacks_leaves_only_that_tool_out(
    hub: McpHub,
) -> None:
    """`allow = ["whoami", "whoamii"]` (a typo, or a tool a server upgrade renamed) is not an
    invalid persona (it dead-lettered the lane): `whoami` is offered, and the missing name is
    listed as unavailable with the server's own names beside it."""
    tag = new_tag()
    toml = _stdio(tag).replace('timeout = "6s"', 'allow = ["whoami", "whoamii"]\ntimeout = "6s"')
    box = _box(hub, toml)
    assert sorted(_tools(box)) == ["t__whoami"]
    [(prefix, _, reason)] = box.unavailable
    assert prefix == "t"
    assert "tools.mcp[0].allow names tools the server does not list: ['whoamii']" in reason
    assert "'sleep'" in reason

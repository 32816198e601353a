"""Declared Python tools, names, byte caps, order and the ``tool.call`` report (no servers).

A ``[[tools.python]] ref`` imports a Tool (or a factory of one); any ref that cannot give a Tool
is an invalid persona naming ``tools.python[n].ref`` and the file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from tests.support.python_tools import CALLS, RELEASE
from workers.persona import python_tools
from workers.persona.agent import from_dir
from workers.persona.dream_agent import dreamer
from workers.persona.errors import PersonaConfigError, ToolSetupSlow, failure_kind
from workers.persona.loop import Budget, run_loop, set_tool_call_observer
from workers.persona.manifest import parse_manifest
from workers.persona.mcp_calls import McpToolInfo
from workers.persona.mcp_hub import McpHub
from workers.persona.mcp_transport import expand, stdio_parameters
from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.python_tools import PythonTool
from workers.persona.tool_config import McpDecl, McpServer
from workers.persona.toolbox import (
    MCP_DESCRIPTION_MAX_CHARS,
    MCP_SCHEMA_MAX_BYTES,
    Toolbox,
    ToolLimits,
    _mcp_tools,
    build_declared,
)
from workers.persona.tools import FunctionTool, ToolResult
from workers.persona.transcripts import FileTranscripts

SOURCE = Path("/p/ava/persona.toml")


def _build(text: str, limits: ToolLimits | None = None, memory: bool = True) -> Toolbox:
    config = parse_manifest(text, source=SOURCE)
    hub = McpHub()  # never started: no MCP server is declared in these tests
    return build_declared(
        config.tools,
        hub=hub,
        limits=limits or ToolLimits(),
        reserved=("memory",) if memory else (),
    )


def _refs(*refs: str) -> str:
    return "".join(f'[[tools.python]]\nref = "{ref}"\n' for ref in refs)


def test_a_python_tool_by_ref_and_by_factory() -> None:
    """A ref to a Tool and a ref to a factory both give working tools, in file order."""
    box = _build(_refs("tests.support.python_tools:shout", "tests.support.python_tools:make_shout"))
    assert [tool.name for tool in box.tools] == ["shout", "shout_made"]
    assert box.tools[0].execute({"text": "hi"}) == ToolResult("HI")


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        (
            "tests.support.no_such_module:tool",
            "cannot import module 'tests.support.no_such_module'",
        ),
        ("tests.support.python_tools:nothing", "has no attribute 'nothing'"),
        ("tests.support.python_tools:NOT_A_TOOL", "is not a Tool"),
        ("tests.support.python_tools:broken_factory", "raised RuntimeError: no weather today"),
        ("tests.support.python_tools:unmarked_factory", "not marked as a tool factory"),
        ("os:abort", "not marked as a tool factory"),
        ("sys:exit", "not marked as a tool factory"),
        ("tests.support.python_tools:NAMELESS", "a tool whose name is NoneType, not a string"),
        ("tests.support.python_tools:SCHEMA_A_STRING", "input_schema that is str, not a JSON"),
        ("tests.support.python_tools:SCHEMA_NOT_JSON", "input_schema that is not JSON"),
        ("tests.support.python_tools:SCHEMA_INFINITE", "input_schema that is not JSON"),
        ("tests.support.python_tools:DESCRIBED_BY_A_NUMBER", "description that is int"),
    ],
)
def test_a_bad_ref_is_an_invalid_persona(ref: str, words: str) -> None:
    """Missing module, missing attribute, not a Tool, a raising factory, a callable not marked
    with @tool_factory (never called: `os:abort` in a persona file crash-looped the worker that
    validated it), a Tool whose name, description or input_schema is of the wrong type (a
    traceback at `soulfleet tools`, and an error naming nothing at each turn): each names the
    key."""
    with pytest.raises(PersonaConfigError) as caught:
        _build(_refs("tests.support.python_tools:shout", ref))
    assert caught.value.key == "tools.python[1].ref"
    assert words in caught.value.problem
    assert str(SOURCE) in str(caught.value)
    assert CALLS == []


def test_a_tool_module_or_factory_that_blocks_fails_the_turn_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Module code that blocks at import (or a factory that never returns) held the turn
    past SOULFLEET_TURN_MAX_SECONDS with its lease renewed, and hung `post` and `tools` in
    the CLI: both are given SETUP_TIMEOUT, then fail naming the key, as a transient error (a
    cold import finishes meanwhile: the retry finds it done). A second turn meeting the same
    import still under way shares its deadline (fails at once past it: `status` spent a
    whole SETUP_TIMEOUT on each dead lane using the module) and starts no second thread."""
    monkeypatch.setattr(python_tools, "SETUP_TIMEOUT", 0.5)
    module = f"hangs_at_import_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text("import threading\nthreading.Event().wait(30)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    began = time.monotonic()
    with pytest.raises(ToolSetupSlow) as caught:
        _build(_refs(f"{module}:tool"))
    assert caught.value.key == "tools.python[0].ref"
    assert f"importing module {module!r} did not finish within 0.5s" in caught.value.problem
    assert failure_kind(caught.value) == "transient"
    setups = [t for t in threading.enumerate() if t.name == "tool-setup"]
    again = time.monotonic()
    with pytest.raises(ToolSetupSlow):
        _build(_refs(f"{module}:tool"))
    assert [t for t in threading.enumerate() if t.name == "tool-setup"] == setups
    # past the import's one deadline: at once, not another SETUP_TIMEOUT for each caller
    assert time.monotonic() - again < 0.3
    with pytest.raises(ToolSetupSlow) as caught:
        _build(_refs("tests.support.python_tools:stuck_factory"))
    assert "calling the factory tests.support.python_tools:stuck_factory did not finish" in (
        caught.value.problem
    )
    assert time.monotonic() - began < 5
    RELEASE.set()


def test_a_tool_added_to_a_module_after_its_import_says_to_restart_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker imports a tool module once: a tool added to the file since (which `soulfleet
    tools`, a fresh process, finds) is missing in the worker, whose error then says the file
    changed after this process imported it and that the workers must restart. A ref missing
    from a module nobody edited says only that it is missing."""
    module = f"edited_tools_{tmp_path.name.replace('-', '_')}"
    path = tmp_path / f"{module}.py"
    path.write_text("from tests.support.python_tools import shout as old\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [tool.name for tool in _build(_refs(f"{module}:old")).tools] == ["shout"]
    with pytest.raises(PersonaConfigError) as untouched:
        _build(_refs(f"{module}:new"))
    assert untouched.value.problem == f"{module!r} has no attribute 'new'"
    path.write_text(path.read_text() + "new = old\n")
    later = time.time() + 5
    os.utime(path, (later, later))
    with pytest.raises(PersonaConfigError) as caught:
        _build(_refs(f"{module}:new"))
    assert f"{module!r} has no attribute 'new' (this process imported {path}" in (
        caught.value.problem
    )
    assert "restart the workers to load the edit" in caught.value.problem


def test_two_tools_with_one_name_are_an_error_naming_both() -> None:
    """Duplicates, including a declared tool taking the built-in ``memory`` name."""
    with pytest.raises(PersonaConfigError) as caught:
        _build(_refs("tests.support.python_tools:shout", "tests.support.python_tools:shout"))
    assert caught.value.key == "tools.python[1]"
    assert "'shout'" in caught.value.problem
    assert "tools.python[0]" in caught.value.problem


def test_byte_caps_refuse_big_arguments_and_results() -> None:
    """Arguments over the cap never reach the tool; a result over the cap is replaced by an
    error naming the cap and the size."""
    [tool] = _build(
        _refs("tests.support.python_tools:shout"),
        ToolLimits(max_args_bytes=100, max_result_bytes=50),
    ).tools
    refused = tool.execute({"text": "a" * 200})
    assert refused.is_error
    assert refused.failure == "too_large"
    assert "100 byte cap on tool arguments (SOULFLEET_TOOL_ARGS_MAX_BYTES)" in refused.output
    big = tool.execute({"text": "b" * 80})
    assert big.is_error
    assert "was 80 bytes, over the 50 byte cap on tool results" in big.output
    assert tool.execute({"text": "ok"}) == ToolResult("OK")


@pytest.mark.integration
def test_a_python_tool_past_its_timeout_is_an_error_result() -> None:
    """A Python tool that does not return within its timeout gives an error result on time."""
    [tool] = _build(
        '[[tools.python]]\nref = "tests.support.python_tools:slow"\ntimeout = "1s"\n'
    ).tools
    started = time.monotonic()
    result = tool.execute({"seconds": 30})
    assert result.is_error
    assert result.failure == "timeout"
    assert time.monotonic() - started < 10


def test_declared_tools_come_before_memory(tmp_path: Path) -> None:
    """The persona's tool order: declared tools in file order, then ``memory`` last."""
    (tmp_path / "persona.toml").write_text(
        _refs("tests.support.python_tools:make_shout", "tests.support.python_tools:shout")
    )
    agent = from_dir(tmp_path)
    box = build_declared(agent.declared, hub=McpHub())
    names = [tool.name for tool in agent.toolset(declared=box.tools)]
    assert names == ["shout_made", "shout", "memory"]


class _OneCall:
    """A model that calls one tool, then answers with its result."""

    spec = "test:one-call"

    def __init__(self, call: ToolCall) -> None:
        self.call = call

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        if messages[-1].role == "tool":
            return Completion(text=messages[-1].content, tool_calls=(), usage=Usage())
        return Completion(text="", tool_calls=(self.call,), usage=Usage())


def test_every_tool_call_is_logged_and_observed() -> None:
    """``tool.call`` carries persona, tool, source, outcome, seconds and result bytes; the
    observer (the fleet's metrics) gets source, outcome and seconds."""
    [tool] = _build(_refs("tests.support.python_tools:shout")).tools
    seen: list[tuple[str, str, float]] = []
    set_tool_call_observer(lambda source, outcome, seconds: seen.append((source, outcome, seconds)))
    try:
        with structlog.testing.capture_logs() as logs:
            result = run_loop(
                system="",
                prompt="go",
                tools=[tool],
                model=_OneCall(ToolCall(id="c1", name="shout", arguments={"text": "hey"})),
                budget=Budget(),
                persona="ava",
            )
    finally:
        set_tool_call_observer(None)
    assert result.text == "HEY"
    [event] = [log for log in logs if log["event"] == "tool.call"]
    assert {k: event[k] for k in ("persona", "tool", "source", "outcome", "result_bytes")} == {
        "persona": "ava",
        "tool": "shout",
        "source": "python",
        "outcome": "ok",
        "result_bytes": 3,
    }
    assert [(source, outcome) for source, outcome, _ in seen] == [("python", "ok")]


@pytest.mark.integration
def test_the_mcp_sdk_loads_only_when_a_server_starts() -> None:
    """Importing the CLI, the turn executor and the one-shot runner does not import the MCP
    SDK (seconds on a busy machine): it loads when a process first starts a server."""
    code = (
        "import sys, workers.cli, workers.turn, workers.persona.runner, workers.persona.toolbox\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_dreamer_never_gets_the_personas_declared_tools(tmp_path: Path) -> None:
    """A dreamer's tools stay exactly memory and transcript_search, whatever is declared."""
    (tmp_path / "persona.toml").write_text(_refs("tests.support.python_tools:shout"))
    persona = from_dir(tmp_path)
    declared = build_declared(persona.declared, hub=McpHub()).tools
    agent = dreamer(tmp_path, store=FileTranscripts(tmp_path, lanes=[persona.name]))
    names = [tool.name for tool in agent.toolset(declared=declared)]
    assert names == ["memory", "transcript_search"]


def test_env_and_header_values_expand_from_the_worker_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``${VAR}`` in env/headers is read from the worker's environment when a server starts."""
    monkeypatch.setenv("SF_TEST_TOKEN", "s3cret")
    monkeypatch.delenv("SF_TEST_UNSET", raising=False)
    assert expand("Bearer ${SF_TEST_TOKEN}") == "Bearer s3cret"
    assert expand("${SF_TEST_UNSET}-$HOME-{x}") == "-$HOME-{x}"
    server = McpServer("stdio", command=sys.executable, env=(("TOKEN", "${SF_TEST_TOKEN}"),))
    params = stdio_parameters(server)
    assert params.env == {"TOKEN": "s3cret"}
    assert "s3cret" not in server.describe()


def _sleeps(arguments: object) -> ToolResult:
    time.sleep(5)
    return ToolResult("too late")


def test_a_tool_call_never_outlasts_the_turn(tmp_path: Path) -> None:
    """A tool whose own timeout is 10 minutes is still cut at the time its turn has left
    (Budget.max_seconds, the fleet's SOULFLEET_TURN_MAX_SECONDS): the call ends as a timeout
    error naming that, and the turn ends at its limit (it ran 10 minutes before)."""
    slow = PythonTool(FunctionTool("slow", "sleeps", {"type": "object"}, _sleeps), timeout=600.0)
    began = time.monotonic()
    result = run_loop(
        system="",
        prompt="go",
        tools=[slow],
        model=_OneCall(ToolCall(id="c1", name="slow", arguments={})),
        budget=Budget(max_seconds=0.5),
        persona="ava",
    )
    assert time.monotonic() - began < 3
    tool_message = next(m for m in result.messages if m.role == "tool")
    assert "did not finish within the 0." in tool_message.content
    assert "its turn had left" in tool_message.content
    assert (result.status, result.limit) == ("incomplete", "max_seconds")


def test_a_server_left_out_of_a_turn_is_counted_as_unavailable() -> None:
    """A server that never starts is observed like a failed call (source mcp, outcome
    unavailable), so soulfleet_tool_calls_total shows it, not only the log."""
    seen: list[tuple[str, str, float]] = []
    set_tool_call_observer(lambda source, outcome, seconds: seen.append((source, outcome, seconds)))
    try:
        box = Toolbox(tools=(), unavailable=(("time", "no-such-cmd", "not found"),))
        with structlog.testing.capture_logs() as logs:
            box.warn_unavailable("ava")
    finally:
        set_tool_call_observer(None)
    assert seen == [("mcp", "unavailable", 0.0)]
    assert [log["event"] for log in logs] == ["tool.server_unavailable"]


def test_a_servers_oversized_tool_listing_is_bounded(tmp_path: Path) -> None:
    """What a server lists is sent with every model call: a description over its cap is cut
    with a note saying so, and a tool whose input schema is over its cap is left out (logged),
    the server's other tools kept."""
    server = McpServer("stdio", command=sys.executable)
    decl = McpDecl("tools.mcp[0]", "srv", server, None, None, None)
    huge_schema = {"type": "object", "description": "x" * (MCP_SCHEMA_MAX_BYTES + 1)}
    listed = (
        McpToolInfo("wordy", "w" * (MCP_DESCRIPTION_MAX_CHARS + 500), {"type": "object"}),
        McpToolInfo("bloated", "fine", huge_schema),
        McpToolInfo("plain", "a plain tool", {"type": "object"}),
    )
    hub = McpHub()
    try:
        with capture_logs() as logs:
            built = _mcp_tools(decl, server, 5.0, hub, listed=listed, source=tmp_path)
            tools = {tool.name: tool for _, tool in built}
    finally:
        hub.close()
    assert sorted(tools) == ["srv__plain", "srv__wordy"]
    wordy = tools["srv__wordy"].description
    assert wordy.endswith(f"[description cut at {MCP_DESCRIPTION_MAX_CHARS} characters]")
    assert len(wordy) < MCP_DESCRIPTION_MAX_CHARS + 100
    assert [e["tool"] for e in logs if e["event"] == "mcp.tool_refused"] == ["bloated"]


def test_a_function_tool_returning_the_wrong_type_says_what_it_must_return() -> None:
    """A FunctionTool whose function returns a str (or None) gave the model "AttributeError:
    'str' object has no attribute 'output'": it now says the function must return a
    ToolResult, and a right answer passes through unchanged."""
    from workers.persona.tools import FunctionTool, ToolResult  # noqa: PLC0415

    wrong = FunctionTool("rstr", "Returns a str.", {"type": "object"}, lambda _: "23")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="returned str, not a ToolResult: it must return"):
        wrong.execute({})
    right = FunctionTool("ok", "Returns a result.", {"type": "object"}, lambda _: ToolResult("5"))
    assert right.execute({}) == ToolResult("5")

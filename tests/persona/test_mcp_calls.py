"""What the model is told of an unavailable MCP server, and what only the operator reads."""

from __future__ import annotations

from workers.persona.mcp_calls import STDERR_SAID, for_the_model


def test_the_model_is_told_why_and_when_but_not_what_the_server_printed() -> None:
    """The quote of a server's last stderr line (any quotes or brackets in it) is cut; what
    follows it, such as when the server is tried again, stays (it was cut too)."""
    printed = "token=s3cr3t (it's a 'trap') [x]"
    reason = f"could not start: MCPError: Connection closed{STDERR_SAID}{printed!r}) (next start"
    reason += " attempt in 2.0s)"
    told = for_the_model(reason)
    assert told == "could not start: MCPError: Connection closed (next start attempt in 2.0s)"
    assert for_the_model("did not start within 30s") == "did not start within 30s"

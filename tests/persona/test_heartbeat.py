"""The heartbeat contract: the wake prompt and the silent sentinel (docs/persona.md §3)."""

from __future__ import annotations

import pytest

from workers.persona.heartbeat import HEARTBEAT_OK, HEARTBEAT_PROMPT, is_silent


def test_sentinel_is_the_cross_port_string() -> None:
    """The silent-no-op sentinel is exactly HEARTBEAT_OK."""
    assert HEARTBEAT_OK == "HEARTBEAT_OK"


def test_prompt_is_the_reference_ports_text() -> None:
    """The heartbeat prompt is byte-identical to the reference ports' prompt."""
    assert HEARTBEAT_PROMPT == (
        "Heartbeat. Read your HEARTBEAT.md section and follow it. "
        "If nothing needs attention, reply HEARTBEAT_OK."
    )


def test_prompt_names_the_trigger_and_the_sentinel() -> None:
    """The prompt contains the word Heartbeat and the sentinel, so models learn the contract."""
    assert "Heartbeat" in HEARTBEAT_PROMPT
    assert HEARTBEAT_OK in HEARTBEAT_PROMPT


@pytest.mark.parametrize(
    "reply",
    ["HEARTBEAT_OK", "  HEARTBEAT_OK\n", "All quiet. HEARTBEAT_OK", "HEARTBEAT_OK - nothing due"],
)
def test_reply_containing_sentinel_is_silent(reply: str) -> None:
    """A reply containing HEARTBEAT_OK anywhere is silent."""
    assert is_silent(reply)


@pytest.mark.parametrize(
    "reply", ["", "Your train leaves at 9.", "heartbeat_ok", "HEARTBEAT OK", "HEARTBEAT_O K"]
)
def test_reply_without_sentinel_is_substantive(reply: str) -> None:
    """A reply without the exact (case-sensitive) sentinel surfaces."""
    assert not is_silent(reply)

"""Outcome values read back from what the lane scripts wrote."""

from __future__ import annotations

import json

from workers.fleet.outcomes import RunReply


def test_a_run_reply_reads_text_status_usage_and_limit() -> None:
    """A committed turn's reply: usage numbers become ints, a missing reason stays None."""
    usage = {"input_tokens": "12", "output_tokens": 3}
    raw = json.dumps(
        {"text": "hi", "status": "done", "turn_id": "t1", "usage": usage, "limit": "max_tokens"}
    )
    reply = RunReply.from_json(raw)
    assert reply == RunReply(
        text="hi",
        status="done",
        turn_id="t1",
        usage={"input_tokens": 12, "output_tokens": 3},
        limit="max_tokens",
        reason=None,
    )


def test_a_refusal_without_usage_reads_as_no_usage_and_its_reason() -> None:
    """A turn refused before any model call carries a reason and no usage."""
    raw = json.dumps({"status": "refused", "turn_id": "t2", "usage": None, "reason": "budget"})
    reply = RunReply.from_json(raw)
    assert (reply.text, reply.status, reply.usage, reply.reason) == ("", "refused", None, "budget")

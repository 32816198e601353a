"""Prompt caching on the wire (issue 11 rule 3): breakpoints, a byte-stable prefix, cache usage.

Both clients run against the real local servers of tests/support/providers.py; the requests are
checked as the server received them.
"""

from __future__ import annotations

from tests.persona.models import test_anthropic, test_openai
from tests.support.providers import FakeProvider, RecordingClock, openai_completion
from workers.persona.messages import Message, Usage

_EPHEMERAL = {"type": "ephemeral"}


def _conversation(turns: int) -> list[Message]:
    messages: list[Message] = []
    for n in range(turns):
        messages.append(Message("user", f"question {n}"))
        messages.append(Message("assistant", f"answer {n}"))
    messages.append(Message("user", "and now?"))
    return messages


def test_anthropic_marks_system_and_end_of_conversation(
    anthropic_server: FakeProvider, clock: RecordingClock
) -> None:
    """The system prompt and the last block of the conversation carry cache_control, and no
    other block does (at most four breakpoints are allowed; two are used)."""
    model = test_anthropic.make(anthropic_server.base_url, clock)
    model.complete(system="You are Ava.", messages=_conversation(3), tools=[])
    body = anthropic_server.bodies[0]
    assert body["system"] == [{"type": "text", "text": "You are Ava.", "cache_control": _EPHEMERAL}]
    blocks = [block for message in body["messages"] for block in message["content"]]
    marked = [block for block in blocks if "cache_control" in block]
    assert marked == [{"type": "text", "text": "and now?", "cache_control": _EPHEMERAL}]


def test_anthropic_cache_usage_is_parsed(
    anthropic_server: FakeProvider, clock: RecordingClock
) -> None:
    """cache_read_input_tokens -> cached_input_tokens, cache_creation_input_tokens ->
    cache_write_input_tokens; input_tokens still counts every prompt token."""
    anthropic_server.enqueue(
        {
            "type": "message",
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "usage": {
                "input_tokens": 7,
                "cache_read_input_tokens": 900,
                "cache_creation_input_tokens": 60,
                "output_tokens": 5,
            },
        }
    )
    model = test_anthropic.make(anthropic_server.base_url, clock)
    usage = model.complete(system="s", messages=[Message("user", "hi")], tools=[]).usage
    assert usage == Usage(967, 5, cached_input_tokens=900, cache_write_input_tokens=60)
    assert usage.to_dict() == {
        "input_tokens": 967,
        "output_tokens": 5,
        "total_tokens": 972,
        "cached_input_tokens": 900,
        "cache_write_input_tokens": 60,
    }


def test_openai_cached_tokens_are_parsed(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """usage.prompt_tokens_details.cached_tokens -> cached_input_tokens (no write figure)."""
    answer = openai_completion("hi", prompt_tokens=1200, completion_tokens=3)
    answer["usage"]["prompt_tokens_details"] = {"cached_tokens": 1024}
    openai_server.enqueue(answer)
    model = test_openai.make(openai_server.base_url, clock)
    usage = model.complete(system="s", messages=[Message("user", "hi")], tools=[]).usage
    assert usage == Usage(1200, 3, cached_input_tokens=1024, cache_write_input_tokens=0)


def test_openai_request_is_a_byte_prefix_of_the_next(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A request that extends a conversation starts with the previous request's bytes, up to
    the closing brackets: tools come before the messages, the messages last."""
    model = test_openai.make(openai_server.base_url, clock)
    first = _conversation(2)
    second = [*first, Message("assistant", "answer 2"), Message("user", "more")]
    model.complete(system="You are Ava.", messages=first, tools=[test_openai.WEATHER])
    model.complete(system="You are Ava.", messages=second, tools=[test_openai.WEATHER])
    one, two = (request.raw for request in openai_server.requests)
    assert list(openai_server.bodies[0]) == ["model", "max_tokens", "tools", "messages"]
    assert two.startswith(one[: -len(b"]}")])

"""The Anthropic Messages client against a real local Messages API server."""

from __future__ import annotations

import random

import pytest

from tests.support.providers import (
    FakeProvider,
    RecordingClock,
    Reply,
    anthropic_message,
    error_reply,
)
from workers.persona.errors import (
    ModelAuthError,
    ModelRateLimited,
    ModelResponseError,
    ModelTimeout,
    ModelUnreachable,
)
from workers.persona.messages import Message, ToolCall, ToolSpec, Usage
from workers.persona.models import Model
from workers.persona.models.anthropic import AnthropicModel
from workers.persona.models.config import ModelConfig, Secret

KEY = "sk-ant-test-0123456789abcdef-SECRET"
WEATHER = ToolSpec(
    name="weather",
    description="The weather in a city.",
    input_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)


def make(
    base_url: str,
    clock: RecordingClock,
    *,
    key: str = KEY,
    timeout: float = 5.0,
    retries: int = 2,
) -> AnthropicModel:
    config = ModelConfig(
        anthropic_base_url=base_url,
        anthropic_api_key=Secret(key),
        timeout=timeout,
        retries=retries,
        max_output_tokens=654,
    )
    return AnthropicModel("claude-test", config, clock=clock, rng=random.Random(7))


def hello(model: AnthropicModel) -> str:
    return model.complete(system="", messages=[Message("user", "hi")], tools=[]).text


def test_is_a_model(anthropic_server: FakeProvider, clock: RecordingClock) -> None:
    """The client satisfies the Model protocol and reports its spec without any key."""
    model = make(anthropic_server.base_url, clock)
    assert isinstance(model, Model)
    assert model.spec == "anthropic:claude-test"
    assert KEY not in repr(model)


def test_tool_round_trip(anthropic_server: FakeProvider, clock: RecordingClock) -> None:
    """tool_use comes back parsed; the result goes out as a tool_result block; text returns."""
    anthropic_server.enqueue(
        anthropic_message("Let me look.", [("toolu_1", "weather", {"city": "Oslo"})]),
        anthropic_message("It is snowing in Oslo.", input_tokens=50, output_tokens=8),
    )
    model = make(anthropic_server.base_url, clock)
    user = Message(role="user", content="Weather in Oslo?")

    first = model.complete(system="You are Ava.", messages=[user], tools=[WEATHER])
    assert first.text == "Let me look."
    assert first.tool_calls == (ToolCall("toolu_1", "weather", {"city": "Oslo"}),)
    assert first.usage == Usage(13, 5)
    assert first.stop_reason == "tool_use"

    result = Message(role="tool", content="snow, -3C", tool_call_id="toolu_1", name="weather")
    second = model.complete(
        system="You are Ava.", messages=[user, first.as_message(), result], tools=[WEATHER]
    )
    assert second.text == "It is snowing in Oslo."
    assert second.tool_calls == ()
    assert second.usage == Usage(50, 8)

    sent = anthropic_server.requests
    assert [r.path for r in sent] == ["/v1/messages"] * 2
    headers = sent[0].headers
    assert headers["x-api-key"] == KEY
    assert headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers
    assert sent[0].body["model"] == "claude-test"
    assert sent[0].body["max_tokens"] == 654
    # The system prompt is one text block carrying a prompt-cache breakpoint (issue 11).
    assert sent[0].body["system"] == [
        {"type": "text", "text": "You are Ava.", "cache_control": {"type": "ephemeral"}}
    ]
    assert sent[0].body["tools"] == [
        {
            "name": "weather",
            "description": "The weather in a city.",
            "input_schema": WEATHER.input_schema,
        }
    ]
    assert sent[1].body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "snow, -3C",
                    "is_error": False,
                    "cache_control": {"type": "ephemeral"},  # the end of the conversation
                }
            ],
        },
    ]


def test_several_tool_calls_merge_results(
    anthropic_server: FakeProvider, clock: RecordingClock
) -> None:
    """Several tool_use blocks keep their order; their results go back as ONE user message."""
    anthropic_server.enqueue(
        anthropic_message(
            None,
            [
                ("t1", "weather", {"city": "Oslo"}),
                ("t2", "weather", {"city": "Rome"}),
                ("t3", "weather", "Paris"),
            ],
        ),
        anthropic_message("Done."),
    )
    model = make(anthropic_server.base_url, clock)
    user = Message(role="user", content="go")
    first = model.complete(system="", messages=[user], tools=[WEATHER])
    assert first.text == ""
    assert [c.id for c in first.tool_calls] == ["t1", "t2", "t3"]
    assert first.tool_calls[2].raw_arguments == '"Paris"'
    assert dict(first.tool_calls[2].arguments) == {}

    results = [
        Message(role="tool", content="sunny", tool_call_id="t1"),
        Message(role="tool", content="rain", tool_call_id="t2"),
        Message(role="tool", content="input must be an object", tool_call_id="t3", is_error=True),
        Message(role="user", content="and tomorrow?"),
    ]
    model.complete(system="", messages=[user, first.as_message(), *results], tools=[])
    body = anthropic_server.requests[1].body
    assert "system" not in body
    assert "tools" not in body
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert [b["type"] for b in body["messages"][1]["content"]] == ["tool_use"] * 3
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "sunny", "is_error": False},
        {"type": "tool_result", "tool_use_id": "t2", "content": "rain", "is_error": False},
        {
            "type": "tool_result",
            "tool_use_id": "t3",
            "content": "input must be an object",
            "is_error": True,
        },
        {"type": "text", "text": "and tomorrow?", "cache_control": {"type": "ephemeral"}},
    ]


def test_text_blocks_joined_and_thinking_ignored(
    anthropic_server: FakeProvider, clock: RecordingClock
) -> None:
    """Text blocks are joined; block types the loop cannot use are skipped; cache tokens count."""
    anthropic_server.enqueue(
        {
            "type": "message",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "One."},
                {"type": "text", "text": "Two."},
            ],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "cache_read_input_tokens": 100, "output_tokens": 4},
        }
    )
    completion = make(anthropic_server.base_url, clock).complete(
        system="", messages=[Message("user", "hi")], tools=[]
    )
    assert completion.text == "One.\n\nTwo."
    assert completion.usage == Usage(103, 4, cached_input_tokens=100)


def test_missing_key_sends_nothing(anthropic_server: FakeProvider, clock: RecordingClock) -> None:
    """Without ANTHROPIC_API_KEY the call fails clearly, naming the variable, and sends nothing."""
    with pytest.raises(ModelAuthError, match="ANTHROPIC_API_KEY"):
        hello(make(anthropic_server.base_url, clock, key=""))
    assert anthropic_server.requests == []


def test_429_with_retry_after_then_success(
    anthropic_server: FakeProvider, clock: RecordingClock
) -> None:
    """A 429 is retried after exactly the Retry-After the server asked for."""
    anthropic_server.enqueue(
        error_reply("anthropic", 429, "rate limited", {"retry-after": "2"}),
        anthropic_message("fine"),
    )
    assert hello(make(anthropic_server.base_url, clock)) == "fine"
    assert clock.sleeps == [2.0]
    assert len(anthropic_server.requests) == 2


def test_429_every_time(anthropic_server: FakeProvider, clock: RecordingClock) -> None:
    """Rate limited on every try: ModelRateLimited with the provider's words."""
    for _ in range(3):
        anthropic_server.enqueue(
            error_reply("anthropic", 429, "Number of requests exceeded", {"retry-after": "1"})
        )
    with pytest.raises(ModelRateLimited) as caught:
        hello(make(anthropic_server.base_url, clock))
    assert "Number of requests exceeded" in str(caught.value)
    assert clock.sleeps == [1.0, 1.0]


def test_500_then_success(anthropic_server: FakeProvider, clock: RecordingClock) -> None:
    """A 500 is retried after a jittered backoff and the second answer is returned."""
    anthropic_server.enqueue(error_reply("anthropic", 500, "boom"), anthropic_message("back"))
    assert hello(make(anthropic_server.base_url, clock)) == "back"
    assert len(clock.sleeps) == 1
    assert 0.25 <= clock.sleeps[0] <= 0.5


def test_529_overloaded_is_retried(anthropic_server: FakeProvider, clock: RecordingClock) -> None:
    """Anthropic's 529 "overloaded" is retried like a 503."""
    anthropic_server.enqueue(
        error_reply("anthropic", 529, "Overloaded"), anthropic_message("made it")
    )
    assert hello(make(anthropic_server.base_url, clock)) == "made it"
    assert len(anthropic_server.requests) == 2


def test_timeout(anthropic_server: FakeProvider, clock: RecordingClock) -> None:
    """A server slower than the timeout gives ModelTimeout once every retry is used."""
    anthropic_server.delay = 5.0
    with pytest.raises(ModelTimeout) as caught:
        hello(make(anthropic_server.base_url, clock, timeout=0.2, retries=1))
    assert "anthropic" in str(caught.value)
    assert "2 tries" in str(caught.value)
    assert len(anthropic_server.requests) == 2


def test_malformed_json(anthropic_server: FakeProvider, clock: RecordingClock) -> None:
    """A 200 whose body is not JSON is a ModelResponseError, not retried, not a crash."""
    anthropic_server.enqueue(Reply(raw=b"<html>gateway</html>"))
    with pytest.raises(ModelResponseError) as caught:
        hello(make(anthropic_server.base_url, clock))
    assert "anthropic" in str(caught.value)
    assert "<html>gateway</html>" in str(caught.value)
    assert len(anthropic_server.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"type": "message"},
        {"content": "text"},
        {"content": [{"type": "text"}]},
        {"content": [{"type": "tool_use", "name": "weather", "input": {}}]},
        {"content": [{"type": "tool_use", "id": "t", "input": {}}]},
        {"content": ["text"]},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    ],
)
def test_missing_fields(
    anthropic_server: FakeProvider, clock: RecordingClock, body: dict[str, object]
) -> None:
    """JSON that breaks the Messages shape is a ModelResponseError."""
    anthropic_server.enqueue(body)
    with pytest.raises(ModelResponseError, match="anthropic"):
        hello(make(anthropic_server.base_url, clock))


def test_401_is_auth_error_without_the_key(
    anthropic_server: FakeProvider, clock: RecordingClock
) -> None:
    """A 401 names ANTHROPIC_API_KEY and never shows the key, even when the server echoes it."""
    anthropic_server.enqueue(error_reply("anthropic", 401, f"invalid x-api-key {KEY}"))
    with pytest.raises(ModelAuthError) as caught:
        hello(make(anthropic_server.base_url, clock))
    message = str(caught.value)
    assert KEY not in message
    assert "invalid x-api-key ***" in message
    assert "ANTHROPIC_API_KEY" in message
    assert "HTTP 401" in message
    assert len(anthropic_server.requests) == 1
    assert clock.sleeps == []


def test_connection_refused(closed_port: int, clock: RecordingClock) -> None:
    """Nothing listening: ModelUnreachable naming the address, after every retry."""
    with pytest.raises(ModelUnreachable) as caught:
        hello(make(f"http://127.0.0.1:{closed_port}", clock, retries=1))
    message = str(caught.value)
    assert f"127.0.0.1:{closed_port}/v1/messages" in message
    assert KEY not in message
    assert len(clock.sleeps) == 1

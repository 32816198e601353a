"""The OpenAI-compatible client against a real local Chat Completions server."""

from __future__ import annotations

import base64
import json
import random

import pytest

from tests.support.providers import (
    FakeProvider,
    RecordingClock,
    Reply,
    error_reply,
    openai_completion,
)
from workers.persona.errors import (
    ModelAuthError,
    ModelError,
    ModelRequestError,
    ModelResponseError,
    ModelServerError,
    ModelTimeout,
    ModelUnreachable,
)
from workers.persona.messages import Message, ToolSpec, Usage
from workers.persona.models import Model
from workers.persona.models.client import MAX_TOKEN_COUNT
from workers.persona.models.config import ModelConfig, Secret
from workers.persona.models.openai import OpenAIModel

KEY = "sk-test-0123456789abcdef-SECRET"
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
) -> OpenAIModel:
    config = ModelConfig(
        openai_base_url=base_url,
        openai_api_key=Secret(key),
        timeout=timeout,
        retries=retries,
        max_output_tokens=321,
    )
    return OpenAIModel("gpt-test", config, clock=clock, rng=random.Random(7))


def test_is_a_model(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """The client satisfies the Model protocol and reports its spec without any key."""
    model = make(openai_server.base_url, clock)
    assert isinstance(model, Model)
    assert model.spec == "openai:gpt-test"
    assert KEY not in repr(model)


def test_tool_round_trip(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A tool call comes back parsed; its result goes out as a role=tool message; text returns."""
    openai_server.enqueue(
        openai_completion(None, [("call_1", "weather", {"city": "Oslo"})]),
        openai_completion("It is snowing in Oslo.", prompt_tokens=40, completion_tokens=9),
    )
    model = make(openai_server.base_url, clock)
    user = Message(role="user", content="Weather in Oslo?")

    first = model.complete(system="You are Ava.", messages=[user], tools=[WEATHER])
    assert first.text == ""
    assert [(c.id, c.name, dict(c.arguments)) for c in first.tool_calls] == [
        ("call_1", "weather", {"city": "Oslo"})
    ]
    assert first.usage == Usage(11, 7)

    result = Message(role="tool", content="snow, -3C", tool_call_id="call_1", name="weather")
    second = model.complete(
        system="You are Ava.", messages=[user, first.as_message(), result], tools=[WEATHER]
    )
    assert second.text == "It is snowing in Oslo."
    assert second.tool_calls == ()
    assert second.usage == Usage(40, 9)
    assert second.stop_reason == "stop"

    sent = openai_server.requests
    assert [r.path for r in sent] == ["/v1/chat/completions"] * 2
    assert sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert sent[0].body["model"] == "gpt-test"
    assert sent[0].body["max_tokens"] == 321
    assert sent[0].body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "The weather in a city.",
                "parameters": WEATHER.input_schema,
            },
        }
    ]
    assert sent[1].body["messages"] == [
        {"role": "system", "content": "You are Ava."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "snow, -3C"},
    ]


def test_several_tool_calls_in_one_reply(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """Several calls keep their order; arguments that are not a JSON object stay raw."""
    openai_server.enqueue(
        openai_completion(
            "Checking.",
            [
                ("a", "weather", {"city": "Oslo"}),
                ("b", "weather", "{not json"),
                ("c", "weather", "[1, 2]"),
                ("d", "weather", ""),
            ],
        ),
        openai_completion("Done."),
    )
    model = make(openai_server.base_url, clock)
    user = Message(role="user", content="go")
    first = model.complete(system="", messages=[user], tools=[WEATHER])
    assert first.text == "Checking."
    assert [c.id for c in first.tool_calls] == ["a", "b", "c", "d"]
    assert first.tool_calls[0].raw_arguments is None
    assert (first.tool_calls[1].raw_arguments, dict(first.tool_calls[1].arguments)) == (
        "{not json",
        {},
    )
    assert first.tool_calls[2].raw_arguments == "[1, 2]"
    assert (first.tool_calls[3].raw_arguments, dict(first.tool_calls[3].arguments)) == (None, {})

    results = [
        Message(role="tool", content="sunny", tool_call_id="a"),
        Message(
            role="tool", content="arguments must be an object", tool_call_id="b", is_error=True
        ),
        Message(role="tool", content="error: bad arguments", tool_call_id="c", is_error=True),
    ]
    model.complete(system="", messages=[user, first.as_message(), *results], tools=[])
    body = openai_server.requests[1].body
    assert "tools" not in body
    assert body["messages"][0] == {"role": "user", "content": "go"}  # no empty system message
    wire_calls = body["messages"][1]["tool_calls"]
    assert [c["function"]["arguments"] for c in wire_calls] == [
        '{"city": "Oslo"}',
        "{not json",
        "[1, 2]",
        "{}",
    ]
    assert body["messages"][1]["content"] == "Checking."
    assert body["messages"][2:] == [
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "ERROR: arguments must be an object"},
        {"role": "tool", "tool_call_id": "c", "content": "error: bad arguments"},
    ]


def test_no_key_sends_no_authorization(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """Local servers need no key: without one, no Authorization header is sent."""
    model = make(openai_server.base_url, clock, key="")
    assert model.complete(system="s", messages=[Message("user", "hi")], tools=[]).text == "ok"
    assert "authorization" not in openai_server.requests[0].headers


def test_429_with_retry_after_then_success(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A 429 is retried after exactly the Retry-After the server asked for."""
    openai_server.enqueue(
        error_reply("openai", 429, "slow down", {"Retry-After": "3"}),
        openai_completion("fine"),
    )
    model = make(openai_server.base_url, clock)
    assert model.complete(system="", messages=[Message("user", "hi")], tools=[]).text == "fine"
    assert clock.sleeps == [3.0]
    assert len(openai_server.requests) == 2


def test_429_with_retry_after_ms(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """OpenAI's retry-after-ms header wins over Retry-After."""
    openai_server.enqueue(
        error_reply("openai", 429, "slow down", {"retry-after-ms": "1500", "Retry-After": "9"}),
        openai_completion("fine"),
    )
    make(openai_server.base_url, clock).complete(
        system="", messages=[Message("user", "hi")], tools=[]
    )
    assert clock.sleeps == [1.5]


def test_500_then_success(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A 500 is retried after a jittered backoff and the second answer is returned."""
    openai_server.enqueue(error_reply("openai", 500, "boom"), openai_completion("recovered"))
    model = make(openai_server.base_url, clock)
    assert model.complete(system="", messages=[Message("user", "hi")], tools=[]).text == "recovered"
    assert len(clock.sleeps) == 1
    assert 0.25 <= clock.sleeps[0] <= 0.5


def test_500_every_time(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """When every try gets a 5xx, the error names provider, status and the server's words."""
    for _ in range(3):
        openai_server.enqueue(error_reply("openai", 503, "upstream overloaded"))
    with pytest.raises(ModelServerError) as caught:
        make(openai_server.base_url, clock).complete(
            system="", messages=[Message("user", "hi")], tools=[]
        )
    message = str(caught.value)
    assert "openai" in message
    assert "HTTP 503" in message
    assert "upstream overloaded" in message
    assert "3 tries" in message
    assert len(openai_server.requests) == 3


def test_timeout(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A server slower than the timeout gives ModelTimeout once every retry is used."""
    openai_server.delay = 5.0
    model = make(openai_server.base_url, clock, timeout=0.2, retries=1)
    with pytest.raises(ModelTimeout) as caught:
        model.complete(system="", messages=[Message("user", "hi")], tools=[])
    assert "openai" in str(caught.value)
    assert "0.2s" in str(caught.value)
    assert len(clock.sleeps) == 1
    assert len(openai_server.requests) == 2


def test_malformed_json(openai_server: FakeProvider, clock: RecordingClock) -> None:
    """A 200 whose body is not JSON is a ModelResponseError, not retried, not a crash."""
    openai_server.enqueue(Reply(raw=b'{"choices": [oops'))
    with pytest.raises(ModelResponseError) as caught:
        make(openai_server.base_url, clock).complete(
            system="", messages=[Message("user", "hi")], tools=[]
        )
    assert "not JSON" in str(caught.value)
    assert len(openai_server.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"choices": []},
        {"choices": [{"message": "text"}]},
        {"choices": [{"message": {"content": 5}}]},
        {"choices": [{"message": {"content": None, "tool_calls": [{"id": "x"}]}}]},
        {"error": {"message": "model is loading"}},
    ],
)
def test_missing_fields(
    openai_server: FakeProvider, clock: RecordingClock, body: dict[str, object]
) -> None:
    """JSON that breaks the Chat Completions shape is a ModelResponseError."""
    openai_server.enqueue(body)
    with pytest.raises(ModelResponseError, match="openai"):
        make(openai_server.base_url, clock).complete(
            system="", messages=[Message("user", "hi")], tools=[]
        )


def test_401_is_auth_error_without_the_key(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A 401 names OPENAI_API_KEY and never shows the key, even when the server echoes it."""
    openai_server.enqueue(error_reply("openai", 401, f"Incorrect API key provided: {KEY}."))
    with pytest.raises(ModelAuthError) as caught:
        make(openai_server.base_url, clock).complete(
            system="", messages=[Message("user", "hi")], tools=[]
        )
    message = str(caught.value)
    assert KEY not in message
    assert "Incorrect API key provided: ***" in message
    assert "OPENAI_API_KEY" in message
    assert "HTTP 401" in message
    assert caught.value.__cause__ is None
    assert len(openai_server.requests) == 1
    assert clock.sleeps == []


def test_a_password_in_the_base_url_is_masked_in_every_form_it_is_echoed_in(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """OPENAI_BASE_URL with user:password (a proxy): httpx sends them as a Basic credential, and
    a server quoting the header, or the password, never gets either into the error."""
    password = "base%40pass-SECRET"
    basic = base64.b64encode(b"u:base@pass-SECRET").decode()
    url = openai_server.base_url.replace("http://", f"http://u:{password}@")
    echo = f"bad header Authorization: Basic {basic}; password base@pass-SECRET or {password}"
    openai_server.enqueue(error_reply("openai", 400, echo))
    with pytest.raises(ModelError) as caught:
        make(url, clock).complete(system="", messages=[Message("user", "hi")], tools=[])
    message = str(caught.value)
    assert basic not in message
    assert "SECRET" not in message
    assert "Authorization: Basic ***" in message


def test_401_without_key_says_it_is_unset(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A 401 with no key configured says OPENAI_API_KEY is not set."""
    openai_server.enqueue(error_reply("openai", 401, "missing bearer"))
    with pytest.raises(ModelAuthError, match="OPENAI_API_KEY is not set"):
        make(openai_server.base_url, clock, key="").complete(
            system="", messages=[Message("user", "hi")], tools=[]
        )


def test_connection_refused(closed_port: int, clock: RecordingClock) -> None:
    """Nothing listening: ModelUnreachable naming the address, after every retry."""
    model = make(f"http://127.0.0.1:{closed_port}/v1", clock, retries=2)
    with pytest.raises(ModelUnreachable) as caught:
        model.complete(system="", messages=[Message("user", "hi")], tools=[])
    message = str(caught.value)
    assert f"127.0.0.1:{closed_port}/v1/chat/completions" in message
    assert "3 tries" in message
    assert KEY not in message
    assert len(clock.sleeps) == 2


def test_request_body_is_json_with_unicode(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """Non-ASCII text reaches the server intact as UTF-8 JSON."""
    make(openai_server.base_url, clock).complete(
        system="Ты — Ава.", messages=[Message("user", "héllo ✓")], tools=[]
    )
    request = openai_server.requests[0]
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.raw.decode("utf-8"))["messages"][1]["content"] == "héllo ✓"


def test_cached_prompt_tokens_are_reported_apart(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """usage.prompt_tokens_details.cached_tokens becomes cached_input_tokens; input_tokens
    stays the whole prompt (cached tokens are billed input too)."""
    body = openai_completion("hi", prompt_tokens=120, completion_tokens=3)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 100}
    openai_server.enqueue(body)
    completion = make(openai_server.base_url, clock).complete(
        system="", messages=[Message("user", "hi")], tools=[]
    )
    assert completion.usage == Usage(120, 3, cached_input_tokens=100)


def test_absurd_token_counts_read_as_the_maximum(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A broken or hostile endpoint reporting 1e17 tokens: the count reads as MAX_TOKEN_COUNT
    (more than any budget, so spend stops; a number Redis and the metrics can add), never a
    figure that fails the usage record after the call was paid."""
    openai_server.enqueue(openai_completion("hi", prompt_tokens=10**17, completion_tokens=10**20))
    completion = make(openai_server.base_url, clock).complete(
        system="", messages=[Message("user", "hi")], tools=[]
    )
    assert completion.usage == Usage(MAX_TOKEN_COUNT, MAX_TOKEN_COUNT)


@pytest.mark.parametrize("status", [400, 200])
def test_a_key_the_excerpt_cut_would_split_is_scrubbed_first(
    openai_server: FakeProvider, clock: RecordingClock, status: int
) -> None:
    """A provider echoing the key so that the 200-character excerpt cuts through it: the key
    was scrubbed only after the cut, so all but its last characters were shown (in the lane's
    error, the logs and `run --local`). Both a refused request and a 200 answer carrying an
    error are scrubbed whole before the cut."""
    lead = "Incorrect API key provided: "
    # the key starts a few characters before the 199th, where the excerpt is cut
    message = lead + "x" * (199 - 5 - len(lead)) + KEY + " please check"
    openai_server.enqueue(Reply(status=status, body={"error": {"message": message}}))
    with pytest.raises((ModelRequestError, ModelResponseError)) as caught:
        make(openai_server.base_url, clock, retries=0).complete(
            system="", messages=[Message(role="user", content="hi")], tools=[]
        )
    shown = str(caught.value)
    assert KEY[:4] not in shown
    assert "***" in shown


def test_an_answer_nested_past_the_recursion_limit_is_a_response_error(
    openai_server: FakeProvider, clock: RecordingClock
) -> None:
    """A body nested 100,000 deep raised RecursionError out of the client (a traceback in
    `run --local`; retried as unclassified, then dead-lettered, in the fleet): it is a
    ModelResponseError naming the provider. Tool-call arguments nested so are arguments
    that are not an object (the loop answers the call with an error the model can fix)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    openai_server.enqueue(Reply(raw=b'{"choices": ' + deep + b"}"))
    with pytest.raises(ModelResponseError, match="nested too deeply"):
        make(openai_server.base_url, clock, retries=0).complete(
            system="", messages=[Message(role="user", content="hi")], tools=[]
        )
    openai_server.enqueue(openai_completion("ok", [("a", "weather", deep.decode())]))
    answer = make(openai_server.base_url, clock).complete(
        system="", messages=[Message(role="user", content="hi")], tools=[WEATHER]
    )
    assert answer.tool_calls[0].raw_arguments == deep.decode()
    assert dict(answer.tool_calls[0].arguments) == {}

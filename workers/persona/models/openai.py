"""The OpenAI-compatible Chat Completions client (OpenAI, Ollama, vLLM, llama.cpp, LM Studio, ...).

Speaks ``POST {OPENAI_BASE_URL}/chat/completions`` with httpx directly rather than through the
official ``openai`` SDK, on purpose:

- one retry/backoff policy shared with the Anthropic client (:mod:`.http`), instead of the
  SDK's own retry loop running inside ours;
- failures mapped onto our :class:`~workers.persona.errors.ModelError` hierarchy, keys scrubbed;
- a small dependency footprint on every worker (httpx is already there; the SDK brings pydantic
  and more, for the two endpoints we use);
- testable against a real local HTTP server that speaks the wire protocol, no SDK internals.

``Authorization: Bearer`` is sent only when ``OPENAI_API_KEY`` is set: local servers need none.
A 401 then says which variable to set. Against ``api.openai.com`` the output cap is sent as
``max_completion_tokens`` (newer OpenAI models refuse ``max_tokens``); every other server gets
``max_tokens``, the field the compatible servers all understand.

Prompt caching is automatic on OpenAI's side and keys on the exact prompt prefix, so the body
puts the parts that never change first (model, output cap, tools) and the growing conversation
last: a session's soul and history are then a byte-stable prefix of every later request. The
cached share the server reports (``usage.prompt_tokens_details.cached_tokens``) is parsed into
:class:`~workers.persona.messages.Usage` ``cached_input_tokens``.

Tool results carry no error flag in this protocol, so an error result whose text does not
already say so is sent with an ``ERROR: `` prefix the model can see.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.models.client import Endpoint, HTTPModel, MalformedAnswer, token_count
from workers.persona.models.config import ModelConfig

__all__ = ["OpenAIModel"]

_OFFICIAL_HOST = "api.openai.com"


class OpenAIModel(HTTPModel):
    """One model on an OpenAI-compatible server; safe to share between threads."""

    provider: ClassVar[str] = "openai"

    @staticmethod
    def _endpoint(config: ModelConfig) -> Endpoint:
        key = config.openai_api_key.reveal()
        auth = {"authorization": f"Bearer {key}"} if key else {}
        return Endpoint(config.openai_base_url, "OPENAI_BASE_URL", key, "OPENAI_API_KEY", auth)

    @property
    def _max_tokens_field(self) -> str:
        official = (urlsplit(self._base_url).hostname or "").lower() == _OFFICIAL_HOST
        return "max_completion_tokens" if official else "max_tokens"

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        body: dict[str, Any] = {"model": self._model, self._max_tokens_field: self._max_tokens}
        if tools:
            # Some compatible servers reject an empty list, so the key is left out instead.
            body["tools"] = [_wire_tool(tool) for tool in tools]
        # Last, so everything before it is a byte-stable prefix of the next request.
        body["messages"] = _wire_messages(system, messages)
        return self._post("/chat/completions", body, _parse)


def _wire_messages(system: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    if system:
        wire.append({"role": "system", "content": system})
    for message in messages:
        if message.role == "user":
            wire.append({"role": "user", "content": message.content})
        elif message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                # The protocol's own shape for "only tool calls": null content.
                entry["content"] = message.content or None
                entry["tool_calls"] = [_wire_call(call) for call in message.tool_calls]
            wire.append(entry)
        else:
            content = message.content
            if message.is_error and not content.lstrip().lower().startswith("error"):
                content = f"ERROR: {content}"
            wire.append(
                {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": content}
            )
    return wire


def _wire_call(call: ToolCall) -> dict[str, Any]:
    arguments = call.raw_arguments
    if arguments is None:
        arguments = json.dumps(dict(call.arguments), ensure_ascii=False)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _wire_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": dict(tool.input_schema),
        },
    }


def _parse(data: Mapping[str, Any]) -> Completion:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        if "error" in data:
            raise MalformedAnswer("answer carries an error", answer=json.dumps(data))
        raise MalformedAnswer("answer has no choices[0]")
    choice: dict[str, Any] = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedAnswer("answer has no choices[0].message")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise MalformedAnswer("choices[0].message.tool_calls is not a list")
    finish = choice.get("finish_reason")
    return Completion(
        text=_text(message),
        tool_calls=tuple(_call(raw, index) for index, raw in enumerate(raw_calls)),
        usage=_usage(data.get("usage")),
        stop_reason=finish if isinstance(finish, str) else None,
    )


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        refusal = message.get("refusal")
        return refusal if isinstance(refusal, str) else ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Some servers answer with content parts, like the ones requests may send.
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    raise MalformedAnswer("choices[0].message.content is neither text nor null")


def _call(raw: object, index: int) -> ToolCall:
    if not isinstance(raw, dict):
        raise MalformedAnswer(f"tool_calls[{index}] is not an object")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise MalformedAnswer(f"tool_calls[{index}] has no function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedAnswer(f"tool_calls[{index}].function has no name")
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        # A few local servers omit ids; the tool result still needs one to refer to.
        call_id = f"call_{uuid.uuid4().hex[:24]}"
    arguments = function.get("arguments")
    if isinstance(arguments, dict):
        return ToolCall(id=call_id, name=name, arguments=arguments)
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return ToolCall(id=call_id, name=name, arguments={})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the recursion limit
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(id=call_id, name=name, arguments=parsed)
    # Not an object: the loop answers this call with an error result the model can fix.
    return ToolCall(id=call_id, name=name, arguments={}, raw_arguments=text)


def _usage(raw: object) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("prompt_tokens_details")
    cached = token_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(
        input_tokens=token_count(raw.get("prompt_tokens")),
        output_tokens=token_count(raw.get("completion_tokens")),
        cached_input_tokens=cached,
    )

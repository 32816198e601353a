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

Tool results carry no error flag in this protocol, so an error result whose text does not
already say so is sent with an ``ERROR: `` prefix the model can see.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

from workers.persona.clock import Clock
from workers.persona.errors import ModelResponseError, ModelSpecError
from workers.persona.messages import Completion, Message, ToolCall, ToolSpec, Usage
from workers.persona.models.config import ModelConfig
from workers.persona.models.http import ProviderHTTP, RetryPolicy, check_base_url, excerpt

__all__ = ["OpenAIModel"]

_OFFICIAL_HOST = "api.openai.com"


class OpenAIModel:
    """One model on an OpenAI-compatible server; safe to share between threads."""

    provider: ClassVar[str] = "openai"

    def __init__(
        self,
        model: str,
        config: ModelConfig,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        max_retry_wait: float = 60.0,
    ) -> None:
        model = model.strip()
        if not model:
            raise ModelSpecError("openai: empty model name; expected 'openai:<model>'")
        self._model = model
        base_url = check_base_url(config.openai_base_url, provider="openai", env="OPENAI_BASE_URL")
        key = config.openai_api_key.reveal()
        headers = {"accept": "application/json", "user-agent": "soulfleet"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        self._max_tokens = config.max_output_tokens
        official = (urlsplit(base_url).hostname or "").lower() == _OFFICIAL_HOST
        self._max_tokens_field = "max_completion_tokens" if official else "max_tokens"
        self._http = ProviderHTTP(
            provider="openai",
            base_url=base_url,
            headers=headers,
            key_env="OPENAI_API_KEY",
            secrets=(key,),
            policy=RetryPolicy(
                timeout=config.timeout, retries=config.retries, max_wait=max_retry_wait
            ),
            clock=clock,
            rng=rng,
        )

    @property
    def spec(self) -> str:
        return f"openai:{self._model}"

    @property
    def closed(self) -> bool:
        return self._http.closed

    def close(self) -> None:
        """Close the connection pool; the model cannot be used afterwards."""
        self._http.close()

    def __repr__(self) -> str:
        return f"OpenAIModel({self._model!r})"

    def complete(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> Completion:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": _wire_messages(system, messages),
            self._max_tokens_field: self._max_tokens,
        }
        if tools:
            # Some compatible servers reject an empty list, so the key is left out instead.
            body["tools"] = [_wire_tool(tool) for tool in tools]
        data = self._http.post_json("/chat/completions", body)
        try:
            return _parse(data)
        except _MalformedError as exc:
            raise self._http.error(ModelResponseError, str(exc)) from None


class _MalformedError(Exception):
    """The answer broke the wire protocol; becomes a ModelResponseError with the provider name."""


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
            raise _MalformedError(f"answer carries an error: {excerpt(json.dumps(data))}")
        raise _MalformedError("answer has no choices[0]")
    choice: dict[str, Any] = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _MalformedError("answer has no choices[0].message")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _MalformedError("choices[0].message.tool_calls is not a list")
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
    raise _MalformedError("choices[0].message.content is neither text nor null")


def _call(raw: object, index: int) -> ToolCall:
    if not isinstance(raw, dict):
        raise _MalformedError(f"tool_calls[{index}] is not an object")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise _MalformedError(f"tool_calls[{index}] has no function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise _MalformedError(f"tool_calls[{index}].function has no name")
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
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(id=call_id, name=name, arguments=parsed)
    # Not an object: the loop answers this call with an error result the model can fix.
    return ToolCall(id=call_id, name=name, arguments={}, raw_arguments=text)


def _usage(raw: object) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    return Usage(
        input_tokens=_count(raw.get("prompt_tokens")),
        output_tokens=_count(raw.get("completion_tokens")),
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

"""What every HTTP provider client shares: its model name, its connection pool and its labels.

The OpenAI and Anthropic clients differ only in their wire formats (request bodies, answers,
auth header); everything around that is the same and lives here once: the empty-name check, the
base-URL check, the :class:`~workers.persona.models.http.ProviderHTTP` built from the
:class:`~workers.persona.models.config.ModelConfig` policy, ``spec``/``closed``/``close``, and
the step that turns a malformed answer into a :class:`ModelResponseError` naming the provider.
The retry and error policy itself stays in :mod:`.http`; this module only wires it up.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from workers.persona.clock import Clock
from workers.persona.errors import ModelResponseError, ModelSpecError
from workers.persona.messages import Completion
from workers.persona.models.config import ModelConfig
from workers.persona.models.http import ProviderHTTP, RetryPolicy, check_base_url
from workers.persona.urls import credential_forms

__all__ = ["Endpoint", "HTTPModel", "MalformedAnswer", "token_count"]


class MalformedAnswer(Exception):
    """The answer broke the wire protocol; :meth:`HTTPModel._post` turns it into a
    ModelResponseError with the provider's name, so it never leaves a client. ``answer``: the
    text to show an excerpt of after the message (made where the keys to scrub are known)."""

    def __init__(self, message: str, *, answer: str | None = None) -> None:
        super().__init__(message)
        self.answer = answer


#: No real call comes near this; a count above it is a broken or hostile endpoint's.
MAX_TOKEN_COUNT = 1_000_000_000


def token_count(value: object) -> int:
    """A usage count as the provider sent it, or 0 when it is absent, not whole or not > 0.

    A count above :data:`MAX_TOKEN_COUNT` reads as that maximum: still more than any daily
    budget (so the spend guard stops as it should), and a number every counter downstream
    (Redis ``HINCRBY``, the metrics) takes; ``1e17`` failed the usage record after the call
    was paid, and the retry paid again."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, MAX_TOKEN_COUNT)
    return 0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one provider lives and how requests to it authenticate (from ModelConfig)."""

    base_url: str
    #: The variable to name when ``base_url`` is unusable.
    base_url_env: str
    key: str
    #: The variable to name when the provider refuses the key (or there is none).
    key_env: str
    #: What the provider's protocol adds to every request (auth, API version).
    auth_headers: Mapping[str, str]


class HTTPModel(ABC):
    """Base of the HTTP provider clients; safe to share between threads.

    Subclasses set :attr:`provider`, say where it lives (:meth:`_endpoint`) and build their
    request bodies from ``_model`` and ``_max_tokens``.
    """

    provider: ClassVar[str]
    #: Whether the provider refuses every request without an API key.
    requires_key: ClassVar[bool] = False

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
            raise ModelSpecError(
                f"{self.provider}: empty model name; expected '{self.provider}:<model>'"
            )
        self._model = model
        endpoint = self._endpoint(config)
        self._base_url = check_base_url(
            endpoint.base_url, provider=self.provider, env=endpoint.base_url_env
        )
        self._has_key = bool(endpoint.key)
        self._key_env = endpoint.key_env
        self._max_tokens = config.max_output_tokens
        self._http = ProviderHTTP(
            provider=self.provider,
            base_url=self._base_url,
            headers={
                "accept": "application/json",
                "user-agent": "soulfleet",
                **endpoint.auth_headers,
            },
            key_env=endpoint.key_env,
            secrets=(endpoint.key, *credential_forms(self._base_url)),
            policy=RetryPolicy(
                timeout=config.timeout, retries=config.retries, max_wait=max_retry_wait
            ),
            clock=clock,
            rng=rng,
        )

    @staticmethod
    @abstractmethod
    def _endpoint(config: ModelConfig) -> Endpoint:
        """This provider's base URL, key and auth headers, read from ``config``."""

    @property
    def missing_key(self) -> str | None:
        """The variable that must hold this provider's API key when it requires one and none
        is set here (Anthropic), else None (OpenAI-compatible servers may need none)."""
        return self._key_env if self.requires_key and not self._has_key else None

    @property
    def spec(self) -> str:
        return f"{self.provider}:{self._model}"

    @property
    def closed(self) -> bool:
        return self._http.closed

    def close(self) -> None:
        """Close the connection pool; the model cannot be used afterwards."""
        self._http.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._model!r})"

    def _post(
        self,
        path: str,
        body: Mapping[str, Any],
        parse: Callable[[Mapping[str, Any]], Completion],
    ) -> Completion:
        """POST ``body`` under the shared policy and ``parse`` the answer into a Completion."""
        data = self._http.post_json(path, body)
        try:
            return parse(data)
        except MalformedAnswer as exc:
            detail = str(exc)
            if exc.answer is not None:
                detail = f"{detail}: {self._http.excerpt(exc.answer)}"
            raise self._http.error(ModelResponseError, detail) from None

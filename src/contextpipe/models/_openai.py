"""The connection both OpenAI APIs share (chat completions and Responses): from arguments, the environment, or Azure.

`OpenAIModel` is the base of `OpenAIChatModel` and `OpenAIResponsesModel`; each adds only its wire
format. Configuration comes from arguments or ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``OPENAI_MODEL`` (and for Azure ``AZURE_OPENAI_ENDPOINT``, ``AZURE_OPENAI_API_KEY``,
``OPENAI_API_VERSION``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Self, TypedDict

from ..errors import UsageError
from ._client import ClientModel, Connection, Vendor, model_name
from .base import ModelSettings

if TYPE_CHECKING:
    import openai

__all__ = ["OPENAI", "OpenAIModel", "OpenAIOptions"]

OPENAI = Vendor(
    label="OpenAI", package="openai", error_base="OpenAIError", key_env="OPENAI_API_KEY", url_env="OPENAI_BASE_URL",
    answer="chat completion",
    keyless="; for a local OpenAI-compatible server (Ollama, vLLM, llama.cpp) pass base_url=... instead",
    reach="that the server runs", model_words="model (or deployment) name",
    overflow_phrases=("maximum context length", "context window", "context_length_exceeded", "too many tokens",
                      "prompt is too long"),
    overflow_codes=("context_length_exceeded", "string_above_max_length"),
)
"""The OpenAI API as error messages and configuration name it."""


class OpenAIOptions(TypedDict, total=False):
    """The connection's keyword arguments, which `OpenAIChatModel` and `OpenAIResponsesModel` both take."""

    api_key: str | None
    """The API key (default ``OPENAI_API_KEY``; none needed with a `base_url`)."""
    base_url: str | None
    """The endpoint (default ``OPENAI_BASE_URL``, else OpenAI's)."""
    organization: str | None
    """The OpenAI organization."""
    timeout: float
    """Seconds per request (default 60)."""
    max_retries: int
    """The SDK's own retries for connection errors, 408/409/429 and 5xx answers (default 2)."""
    settings: ModelSettings | None
    """Default settings for every call."""
    client: openai.AsyncOpenAI | None
    """A configured client to use (and leave open) instead of building one."""
    media_types: Sequence[str] | None
    """Patterns of the media types the model reads in tool results (default: whatever the API takes)."""


class OpenAIModel(ClientModel["openai.AsyncOpenAI"]):
    """A model served over an OpenAI API, through an ``openai.AsyncOpenAI`` (or ``AsyncAzureOpenAI``) client.

    `max_retries` is the SDK's own retry count for connection errors, 408/409/429 and 5xx answers;
    `timeout` is seconds per request. Pass `client` to reuse a configured ``openai.AsyncOpenAI``.
    `media_types` says which media in tool results the model reads, as patterns (``("image/*",)``);
    the rest are left out, named in the result's text and the trace. None (the default) sends all
    the API takes; ``()`` suits a text-only model.
    """

    def __init__(self, model: str | None = None, *, api_key: str | None = None, base_url: str | None = None,
                 organization: str | None = None, timeout: float = 60.0, max_retries: int = 2,
                 settings: ModelSettings | None = None, client: openai.AsyncOpenAI | None = None,
                 media_types: Sequence[str] | None = None) -> None:
        name = model_name(model, "OPENAI_MODEL", "OpenAIChatModel('gpt-4o-mini') (or your server's model name)")
        owned = client is None
        if client is None:
            api_key, base_url = OPENAI.credentials(api_key, base_url)
            client = OPENAI.sdk().AsyncOpenAI(api_key=api_key, base_url=base_url, organization=organization,
                                              timeout=timeout, max_retries=max_retries)
        provider = "azure.ai.openai" if type(client).__name__ == "AsyncAzureOpenAI" else "openai"
        super().__init__(name, Connection(client, OPENAI, provider, owned), settings, media_types)

    @classmethod
    def azure(cls, deployment: str, *, endpoint: str | None = None, api_key: str | None = None,
              api_version: str | None = None, timeout: float = 60.0, max_retries: int = 2,
              settings: ModelSettings | None = None) -> Self:
        """Return a model for an Azure OpenAI deployment.

        Reads ``AZURE_OPENAI_ENDPOINT``, ``AZURE_OPENAI_API_KEY`` and ``OPENAI_API_VERSION`` when the
        arguments are not given.
        """
        sdk = OPENAI.sdk()
        endpoint = endpoint or os.environ.get("AZURE_OPENAI_ENDPOINT")
        api_key = api_key or os.environ.get("AZURE_OPENAI_API_KEY")
        api_version = api_version or os.environ.get("OPENAI_API_VERSION")
        missing = [n for n, v in (("endpoint / AZURE_OPENAI_ENDPOINT", endpoint),
                                  ("api_key / AZURE_OPENAI_API_KEY", api_key),
                                  ("api_version / OPENAI_API_VERSION", api_version)) if not v]
        if missing:
            raise UsageError("Azure OpenAI needs " + ", ".join(missing))
        client = sdk.AsyncAzureOpenAI(azure_endpoint=endpoint, api_key=api_key, api_version=api_version,
                                      timeout=timeout, max_retries=max_retries)
        return cls(deployment, client=client, settings=settings)._adopt(client, "azure.ai.openai")

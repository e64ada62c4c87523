"""`SentenceTransformerEmbedder`: any sentence-transformers model folder on this machine (torch, offline)."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Sequence
from typing import Any

from ...errors import UsageError
from ._common import LoadOnce, QueryBatches, QueryThread, check_query_threads, float_lists, sentence_transformer


class SentenceTransformerEmbedder(QueryBatches):
    """Any sentence-transformers model in a folder on this machine (torch, offline): bring your own model.

    For a model stronger than `LocalEmbedder`'s, at the price of its speed: all-mpnet-base-v2, for one,
    recalls more of the evidence of the recall fixtures than all-MiniLM-L6-v2 at several times its time
    per recall (docs/recall.md, "Memory recall", measures it in int8 as `MPNetEmbedder`). `model_path`
    is a folder as sentence-transformers saves one (with ``modules.json``), e.g. a snapshot in the
    Hugging Face cache; nothing is downloaded. `name` is the folder's name (a cache snapshot's: its
    model's) unless given; `dimension` is the model's. Texts are embedded as documents and search
    queries as queries (with the model's own prompts, if it has any), texts in batches on all cores,
    queries in a thread of their own with `query_threads` threads; vectors are normalised. Needs ``pip
    install "contextpipe[local-torch]"``.

    >>> SentenceTransformerEmbedder("/models/all-mpnet-base-v2").name
    'all-mpnet-base-v2'
    >>> SentenceTransformerEmbedder("/hf/models--BAAI--bge-small-en-v1.5/snapshots/5c38ec7c").name
    'bge-small-en-v1.5'
    """

    def __init__(self, model_path: str | os.PathLike[str], *, name: str | None = None, batch_size: int = 64,
                 query_threads: int = 1) -> None:
        check_query_threads(query_threads)
        self.path = os.path.abspath(os.fspath(model_path))
        self.batch_size = batch_size
        self.query_threads = query_threads
        self._name = name or model_name(self.path)
        self._dimension: int | None = None
        self._load = LoadOnce(self._load_model)
        self._query_thread = QueryThread(query_threads)

    @property
    def dimension(self) -> int:
        """The size of the model's vectors (the model is loaded to say)."""
        if self._dimension is None:
            model = self._load()
            size = (getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)()
            self._dimension = int(size) if size else len(self._encode(["dimension"], 1, query=False)[0])
        return self._dimension

    @property
    def name(self) -> str:
        """The model's name (its folder's, unless given)."""
        return self._name

    def _load_model(self) -> Any:
        if not os.path.isfile(os.path.join(self.path, "modules.json")):
            raise UsageError(f"{self.path} is not a sentence-transformers model folder (no modules.json); "
                             "give the folder the model was saved to")
        return sentence_transformer(self.path, 'SentenceTransformerEmbedder needs sentence-transformers: '
                                               'pip install "contextpipe[local-torch]"')

    def _encode(self, texts: list[str], batch_size: int, *, query: bool) -> list[list[float]]:
        model = self._load()
        encode = getattr(model, "encode_query" if query else "encode_document", None) or model.encode
        vectors = encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
        return float_lists(vectors.tolist())

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` as documents, in a worker thread (the model runs on the CPU)."""
        if not texts:
            return []
        return await asyncio.to_thread(self._encode, list(texts), self.batch_size, query=False)

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed a few search queries in one run of the model, in the query thread."""
        if not texts:
            return []
        return await self._query_thread.run(functools.partial(self._encode, list(texts), len(texts), query=True))


def model_name(path: str) -> str:
    """Return a model folder's name (a Hugging Face cache snapshot's, ``models--org--name/snapshots/<hash>``: name)."""
    parts = os.path.normpath(path).split(os.sep)
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].split("--")[-1]
    return parts[-1]

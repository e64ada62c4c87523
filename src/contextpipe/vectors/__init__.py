"""Vectors for memory and search: embedders, vector stores, and document ingestion.

The stores (numpy), embedders (their SDKs and models) and ingestion (`chunk_markdown`,
`ingest_folder`, in ``vectors/ingest.py``) are imported when first named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from . import _cxx
from .base import Embedder, SearchHit, VectorRecord, VectorStore, Where, embed_query

if TYPE_CHECKING:
    from .choice import embedder_for
    from .embedders import (
        E5SmallEmbedder,
        HashEmbedder,
        LocalEmbedder,
        MPNetEmbedder,
        OpenAIEmbedder,
        SentenceTransformerEmbedder,
    )
    from .ingest import Chunk, chunk_markdown, chunk_text, ingest_folder
    from .memory import MemoryVectorStore
    from .pgvector import PgVectorStore
    from .sqlite import SQLiteVectorStore

__all__ = [
    "Chunk",
    "E5SmallEmbedder",
    "Embedder",
    "HashEmbedder",
    "LocalEmbedder",
    "MPNetEmbedder",
    "MemoryVectorStore",
    "OpenAIEmbedder",
    "PgVectorStore",
    "SQLiteVectorStore",
    "SearchHit",
    "SentenceTransformerEmbedder",
    "VectorRecord",
    "VectorStore",
    "Where",
    "chunk_markdown",
    "chunk_text",
    "embed_query",
    "embedder_for",
    "ingest_folder",
]


__getattr__ = lazy_exports(__name__, {
    "E5SmallEmbedder": ".embedders", "HashEmbedder": ".embedders", "LocalEmbedder": ".embedders",
    "MPNetEmbedder": ".embedders", "OpenAIEmbedder": ".embedders", "SentenceTransformerEmbedder": ".embedders",
    "MemoryVectorStore": ".memory", "SQLiteVectorStore": ".sqlite",
    "PgVectorStore": ".pgvector", "embedder_for": ".choice",
    "Chunk": ".ingest", "chunk_markdown": ".ingest", "chunk_text": ".ingest", "ingest_folder": ".ingest"})

_cxx.prepare()  # before anything here loads usearch (see _cxx)

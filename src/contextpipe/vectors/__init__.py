"""Vectors for memory and search: embedders, vector stores, and document ingestion.

The stores (numpy), embedders (their SDKs and models; one module each in ``vectors/embedders/``) and
ingestion (`chunk_markdown`, `ingest_folder`, in ``vectors/ingest.py``) are imported when first named.

Importing this package has one side effect, on Linux: it calls into the system's C++ runtime
(``libstdc++.so.6``) through ctypes to set up its standard locale (`_cxx.prepare`, i.e.
``std::locale::classic()``), before anything here can load usearch. usearch's wheels carry their own
copy of the C++ runtime whose locale facet ids the dynamic linker shares process-wide; if usearch is
loaded first, the ids collide and the next library to use a locale facet (onnxruntime from 1.23 on,
at its import) crashes the process with SIGSEGV. Importing ``contextpipe.vectors`` before usearch
itself keeps `LocalEmbedder` and `MPNetEmbedder` safe; see ``vectors/_cxx.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from . import _cxx
from .base import Embedder, SearchHit, VectorRecord, VectorStore, Where, embed_query

if TYPE_CHECKING:
    from ._recall import IndexStats
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
    "IndexStats",
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
    "MemoryVectorStore": ".memory", "SQLiteVectorStore": ".sqlite", "IndexStats": "._recall",
    "PgVectorStore": ".pgvector", "embedder_for": ".choice",
    "Chunk": ".ingest", "chunk_markdown": ".ingest", "chunk_text": ".ingest", "ingest_folder": ".ingest"})

_cxx.prepare()  # before anything here loads usearch (see _cxx)

"""Vectors for memory and search: embedders, vector stores, and document ingestion.

The stores (numpy) and embedders (their SDKs and models) are imported when first named.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .base import Embedder, SearchHit, VectorRecord, VectorStore, Where, embed_query

if TYPE_CHECKING:
    from .embedders import E5SmallEmbedder, HashEmbedder, LocalEmbedder, OpenAIEmbedder
    from .memory import MemoryVectorStore
    from .pgvector import PgVectorStore
    from .sqlite import SQLiteVectorStore

__all__ = [
    "E5SmallEmbedder",
    "Embedder",
    "HashEmbedder",
    "LocalEmbedder",
    "MemoryVectorStore",
    "OpenAIEmbedder",
    "PgVectorStore",
    "SQLiteVectorStore",
    "SearchHit",
    "VectorRecord",
    "VectorStore",
    "Where",
    "chunk_text",
    "embed_query",
    "ingest_folder",
]


def chunk_text(text: str, *, size: int = 1200, overlap: int = 150) -> list[str]:
    """Split `text` into chunks of at most `size` characters, cut at paragraph, line or word breaks.

    Each chunk starts with up to `overlap` characters of the previous one.
    """
    text = text.strip()
    chunks: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            window = text[start:end]
            for sep in ("\n\n", "\n", ". ", " "):
                cut = window.rfind(sep)
                if cut > size // 3:
                    end = start + cut + len(sep)
                    break
        chunk = text[start:end].strip()
        if chunk:
            chunks.append(chunk)
        if end >= len(text):
            break
        start = max(end - overlap, start + 1)
    return chunks


async def ingest_folder(
    folder: str | Path,
    vectors: VectorStore,
    embedder: Embedder,
    *,
    collection: str = "documents",
    patterns: tuple[str, ...] = ("*.md", "*.txt"),
    chunk_size: int = 1200,
    overlap: int = 150,
    batch: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Chunk and index the text and Markdown files under `folder`; return the number of chunks.

    Each chunk's metadata has ``source`` (the file's path relative to `folder`) and ``chunk``; ids are
    stable, so indexing again replaces rather than duplicates. `progress(done, total)` is called after
    each file.
    """
    root = Path(folder)

    def list_files() -> list[Path]:
        return sorted({p for pattern in patterns for p in root.rglob(pattern) if p.is_file()})

    files = await asyncio.to_thread(list_files)
    total = 0
    for done, path in enumerate(files, 1):
        rel = str(path.relative_to(root))
        text = await asyncio.to_thread(path.read_text, encoding="utf-8", errors="replace")
        chunks = chunk_text(text, size=chunk_size, overlap=overlap)
        for start in range(0, len(chunks), batch):
            part = chunks[start:start + batch]
            embedded = await embedder.embed(part)
            await vectors.upsert(collection, [
                VectorRecord(hashlib.sha1(f"{rel}:{start + i}".encode()).hexdigest(), v, text,
                             {"source": rel, "chunk": start + i})
                for i, (text, v) in enumerate(zip(part, embedded, strict=True))])
        await vectors.delete(collection, where={"source": rel, "chunk": list(range(len(chunks), len(chunks) + 1000))})
        total += len(chunks)
        if progress is not None:
            progress(done, len(files))
    return total


__getattr__ = lazy_exports(__name__, {
    "E5SmallEmbedder": ".embedders", "HashEmbedder": ".embedders", "LocalEmbedder": ".embedders",
    "OpenAIEmbedder": ".embedders", "MemoryVectorStore": ".memory", "SQLiteVectorStore": ".sqlite",
    "PgVectorStore": ".pgvector"})

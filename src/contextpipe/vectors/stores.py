"""The embedded vector stores (kept for imports): one module per backend now.

`MemoryVectorStore` (tests) is in ``memory``, `SQLiteVectorStore` (the embedded default) in ``sqlite``,
`PgVectorStore` in ``pgvector``.
"""

from __future__ import annotations

from .memory import MemoryVectorStore
from .sqlite import SQLiteVectorStore

__all__ = ["MemoryVectorStore", "SQLiteVectorStore"]

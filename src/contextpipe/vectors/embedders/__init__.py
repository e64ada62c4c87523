"""Embedders that turn texts into vectors: one module per embedder, the shared parts in ``_common``.

`OpenAIEmbedder` (``openai``: any OpenAI-compatible endpoint), `MPNetEmbedder` (``mpnet``:
all-mpnet-base-v2 on this machine, offline, int8 ONNX built from the released weights),
`LocalEmbedder` (``minilm``: all-MiniLM-L6-v2, smaller and faster: int8 ONNX on onnxruntime, or
float on torch), `E5SmallEmbedder` (``e5``: multilingual-e5-small, retrieval-trained, 4-bit, offline,
no torch), `SentenceTransformerEmbedder` (``sentence_transformer``: any sentence-transformers model
folder, offline) and `HashEmbedder` (``hashing``: deterministic word hashing, for tests and offline
demos). Importing this package loads no model, SDK or runtime: each loads its own on first use.
"""

from __future__ import annotations

from .e5 import E5SmallEmbedder
from .hashing import HashEmbedder
from .minilm import LocalEmbedder
from .mpnet import MPNetEmbedder
from .openai import OpenAIEmbedder
from .sentence_transformer import SentenceTransformerEmbedder

__all__ = ["E5SmallEmbedder", "HashEmbedder", "LocalEmbedder", "MPNetEmbedder", "OpenAIEmbedder",
           "SentenceTransformerEmbedder"]

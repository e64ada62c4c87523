#!/usr/bin/env python3
"""usearch against hnswlib on the same vectors: build time, one-vector insert, search p50, recall@10 vs exact.

    python bench/ann_compare.py                 # 100,000 x 384, clustered like sentence embeddings
    python bench/ann_compare.py --n 20000       # quicker

Needs ``pip install usearch hnswlib`` (hnswlib is only needed here: contextpipe uses usearch).
The vectors are a mixture of 2,000 Gaussian clusters (unit-normalised), which is closer to real text
embeddings than uniform noise; the same vectors and queries go to both libraries, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--inserts", type=int, default=300)
    args = parser.parse_args()
    import hnswlib
    from usearch.index import Index

    base, probes = data(args.n + args.inserts, args.dim, args.queries)
    extra, base = base[args.n:], base[:args.n]
    truth = exact(base, probes, 10)
    keys = np.arange(args.n, dtype=np.uint64)

    t0 = time.perf_counter()
    us = Index(ndim=args.dim, metric="cos", dtype="f32", connectivity=16, expansion_add=128, expansion_search=64)
    us.add(keys, base, threads=1)
    us_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    hn = hnswlib.Index(space="cosine", dim=args.dim)
    hn.init_index(max_elements=args.n + args.inserts, M=16, ef_construction=128)
    hn.set_num_threads(1)
    hn.add_items(base, keys)
    hn.set_ef(64)
    hn_build = time.perf_counter() - t0

    times: dict[str, list[float]] = {"usearch": [], "hnswlib": []}
    found: dict[str, int] = {"usearch": 0, "hnswlib": 0}
    for q, want in zip(probes, truth, strict=True):  # interleaved, one query at a time
        t0 = time.perf_counter()
        got = us.search(q, 10, threads=1).keys
        times["usearch"].append(time.perf_counter() - t0)
        found["usearch"] += len(want & set(got.tolist()))
        t0 = time.perf_counter()
        labels, _ = hn.knn_query(q, k=10)
        times["hnswlib"].append(time.perf_counter() - t0)
        found["hnswlib"] += len(want & set(labels[0].tolist()))
    inserts: dict[str, list[float]] = {"usearch": [], "hnswlib": []}
    for i, v in enumerate(extra):
        t0 = time.perf_counter()
        us.add(args.n + i, v, threads=1)
        inserts["usearch"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hn.add_items(v[None, :], [args.n + i])
        inserts["hnswlib"].append(time.perf_counter() - t0)

    print(f"{args.n:,} x {args.dim}, {args.queries} queries, one thread each\n")
    print("| library | build s | insert one ms (p50) | search ms (p50) | recall@10 vs exact |")
    print("|---|---:|---:|---:|---:|")
    for name, build in (("usearch", us_build), ("hnswlib", hn_build)):
        print(f"| {name} | {build:.1f} | {statistics.median(inserts[name]) * 1000:.3f} | "
              f"{statistics.median(times[name]) * 1000:.3f} | {found[name] / (10 * len(probes)):.3f} |")


if __name__ == "__main__":
    main()

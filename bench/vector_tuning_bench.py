#!/usr/bin/env python3
"""What a collection's own recall checks find and cost: the default depth against the depth it chooses.

    python bench/vector_tuning_bench.py                       # 100,000 x 384, two datasets (~10 minutes)
    python bench/vector_tuning_bench.py --n 20000 --out bench/results/vectors-tuning.json

Datasets (drawn before anything was measured, seeded): ``clustered``, the 200-cluster mixture the
issue describes (centres N(0, 1), spread 0.6, as ``bench/ann_compare.py`` draws its 2,000 clusters),
and ``uniform`` (unit Gaussian noise, where no graph walk does well). The index is `SQLiteVectorStore`'s
own (`_hnsw.CollectionIndex`, 8-bit graph, float32 re-scoring); the tuner (`_recall.DepthTuner`,
target 0.98) is fed `--tune` queries the way the store feeds it, then both depths are measured on
`--queries` held-out queries: recall@10 against the exact float32 top 10, and search time (median of
the calling thread's wall time per search, interleaved between the two depths). The check's own cost
(`reference_top` plus the two walks) is timed too.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import _harness as h
from contextpipe.vectors import _hnsw, _recall


def draw(kind: str, n: int, dim: int, seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    if kind == "clustered":
        centres = rng.standard_normal((200, dim), dtype=np.float32)
        x = centres[rng.integers(0, 200, n)] + 0.6 * rng.standard_normal((n, dim), dtype=np.float32)
    else:
        x = rng.standard_normal((n, dim), dtype=np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def build(matrix: np.ndarray[Any, Any]) -> _hnsw.CollectionIndex:
    c = _hnsw.CollectionIndex(0)
    rows = [(i + 1, f"v{i}", matrix.shape[1], matrix[i].tobytes(), "", "{}") for i in range(len(matrix))]
    for start in range(0, len(rows), 4096):
        c.put(rows[start:start + 4096])
    return c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--tune", type=int, default=300, help="queries fed to the tuner")
    parser.add_argument("--queries", type=int, default=300, help="held-out queries measured")
    h.out_argument(parser, "vectors-tuning")
    args = parser.parse_args()
    results = h.Results("vectors-tuning", "SQLiteVectorStore's index at its default search depth and at the depth "
                        "its recall checks choose (target 0.98): recall@10 vs exact float32, search time, check cost")
    search = _hnsw.IndexSearch()
    for kind in ("clustered", "uniform"):
        matrix = draw(kind, args.n + args.tune + args.queries, args.dim, seed=7)
        c = build(matrix[:args.n])
        tune, held = matrix[args.n:args.n + args.tune], matrix[args.n + args.tune:]
        tuner, default = _recall.DepthTuner(0.98), _recall.DepthTuner(None)
        check_times = []
        for q in tune:
            if tuner.searched(q, 10, args.n, walked=True):
                start = time.perf_counter()
                tuner.check(c, search, scan_limit=0)
                check_times.append(time.perf_counter() - start)
        found = {"default": 0, "tuned": 0}
        times: dict[str, list[float]] = {"default": [], "tuned": []}
        for i, q in enumerate(held):
            truth = {key for key, _ in _hnsw.exact_top(c, q, 10, None)}
            for side in h.rotated(["default", "tuned"], i):
                t = default if side == "default" else tuner
                start = time.perf_counter()
                hits = _recall.nearest(c, q, 10, None, exact_limit=0, scan_limit=0, search=search, scale=t.scale,
                                       scan=t.scan)
                times[side].append((time.perf_counter() - start) * 1000)
                found[side] += len(truth & {key for key, _ in hits})
        case = f"{kind} {args.n} x {args.dim}"
        stats = tuner.stats(c, scan_limit=0)
        for side in ("default", "tuned"):
            results.add(case, side, "recall@10", "", value=found[side] / (10 * len(held)))
            results.add(case, side, "search p50", "ms", times[side], keep_samples=False)
        results.add(case, "tuned", "depth scale", "", value=stats.depth_scale, mode=stats.mode)
        results.add(case, "tuned", "check", "ms", [t * 1000 for t in check_times], keep_samples=False)
        results.ratio(case, "search p50", "tuned", "default")
        print(case, {s: round(found[s] / (10 * len(held)), 3) for s in found},
              {s: round(float(np.median(times[s])), 3) for s in times}, stats, flush=True)
    results.write(args.out)


if __name__ == "__main__":
    main()

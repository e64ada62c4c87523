#!/usr/bin/env python3
"""The embedded SQLite vector store (HNSW index, usearch) as it grows; optionally pgvector too.

    python bench/vector_bench.py                        # SQLite: 10,000 and 100,000 vectors of 384 dimensions
    python bench/vector_bench.py --size 1000000         # the 1,000,000 run (about 15 minutes on 2 idle cores)
    python bench/vector_bench.py --pgvector DSN         # also PostgreSQL + pgvector (HNSW)
    python bench/vector_bench.py --against ../main/src  # this store against another checkout's, interleaved
    python bench/vector_bench.py --seams --size 50000   # each fast path against its plain version
    python bench/vector_bench.py --depths "" --out bench/results/vectors-growth.json
    python bench/vector_bench.py --against /tmp/cp-16e79cd/src --size 100000 --rounds 4 \
        --out bench/results/vectors-against.json

With ``--out FILE`` the results go to FILE (``bench/_harness.py``'s schema), and the search depths
measured at the largest size to FILE's name with ``-depths`` added.

Per size: loading time (batches of 5,000 records, each one committed transaction, the index kept up to
date as they land; wall and CPU), search p50/p95 (top 10) with the CPU time the process spent (a busy
machine inflates it less than wall-clock time), search filtered to 1% of the records, recall@10
against exact search over the same vectors, and one-record upserts (a committed SQLite transaction;
the record is searchable when it returns) with ``synchronous=NORMAL`` and ``FULL`` (an fsync per
commit) interleaved, and ten records per upsert (per record). A one-record ``NORMAL`` upsert adds its
record to the HNSW graph on the store's worker thread after it returns (searches score it exactly
until then), so it is also timed until that is done ("until in the graph": the upsert, then a
round trip to the worker thread, which runs after the graph insert), and back to back (one after
another with nothing between them). Then, for the largest size: the saved index file and the
database file sizes, and a cold start in another process (open, load the saved index and the rows,
first search) with that process's peak memory. The vectors are 2,000 Gaussian clusters on the unit
sphere, shaped like sentence embeddings; the queries are drawn the same way.

``--against SRC`` instead compares this tree's store with the one in another checkout's ``src``
(before/after a change) in one process: the largest size is loaded once, each side opens its own
copy of the file (fresh copies each round, the side opened first alternating: it measures slower), and
the same searches and one-record upserts alternate between the sides (which side goes first alternates
too), so background load hits both alike; CPU time per operation (each upsert is followed, outside
its timing, by a round trip to its side's worker thread, so that no graph insert left running there
is counted in the other side's next operation; "until in the graph" includes that round trip). Searches
are measured twice: back to back, and each right after a filtered search on the same side (as in the
main table, where a filtered search runs before each plain one and leaves the CPU caches cold).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import _harness as h
from contextpipe.vectors import SQLiteVectorStore, VectorRecord, VectorStore


def clustered(rng: np.random.Generator, centres: np.ndarray[Any, Any], m: int) -> np.ndarray[Any, Any]:
    x = centres[rng.integers(0, len(centres), m)] + 0.6 * rng.standard_normal((m, centres.shape[1]), dtype=np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def exact_top(matrix: np.ndarray[Any, Any], queries: np.ndarray[Any, Any], k: int) -> list[set[int]]:
    """The true top `k` of each query (cosine on unit vectors), in slices of the collection."""
    best = np.zeros((len(queries), 0), dtype=np.int64)
    best_scores = np.zeros((len(queries), 0), dtype=np.float32)
    for start in range(0, len(matrix), 100_000):
        scores = np.concatenate([best_scores, queries @ matrix[start:start + 100_000].T], axis=1)
        ids = np.concatenate([best, np.arange(start, start + min(100_000, len(matrix) - start))[None, :]
                              .repeat(len(queries), axis=0)], axis=1)
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        best, best_scores = np.take_along_axis(ids, top, axis=1), np.take_along_axis(scores, top, axis=1)
    return [set(row.tolist()) for row in best]


async def synchronous(store: VectorStore, mode: str) -> None:
    """Switch the SQLite store's durability between upserts (the same connection, file and index)."""
    assert isinstance(store, SQLiteVectorStore)
    await store._run(lambda conn: conn.execute(f"PRAGMA synchronous = {mode}"))
    store.synchronous = mode  # type: ignore[assignment]  # (FULL: upserts commit on the worker thread)


async def idle(store: Any) -> None:
    """Return once the store's worker thread has done what was queued (a quick upsert's graph insert).

    A quick upsert queues its graph insert once the event loop gets control back (the ``sleep(0)``);
    a call queued on the worker thread after it returns after it.
    """
    await asyncio.sleep(0)
    await store._run(lambda conn: None)


async def timed_search(store: VectorStore, query: Any, want: set[int]) -> tuple[float, float, int]:
    """One top-10 search: its wall and CPU seconds, and how many of the exact top 10 (`want`) it found."""
    with h.Stopwatch() as watch:
        hits = await store.search("bench", query, k=10)
    return watch.wall, watch.cpu, len(want & {int(hit.id[1:]) for hit in hits})


def ms(values: list[float]) -> list[float]:
    return [v * 1000 for v in values]


async def depth_sweep(store: VectorStore, probes: np.ndarray[Any, Any], truth: list[set[int]],
                      depths: list[tuple[int, int]], size: str, results: h.Results) -> None:
    """recall@10 and search p50 through the store with other search depths (expansion, candidates re-scored)."""
    from contextpipe.vectors import _hnsw as module

    default = module.search_depth
    try:
        for expansion, candidates in depths:
            module.search_depth = lambda size, k, e=expansion, c=candidates: (max(e, c), c)  # type: ignore[misc]
            times, cpu, found = [], [], 0
            for q, want in zip(probes, truth, strict=True):
                wall, used, got = await timed_search(store, q, want)
                times.append(wall)
                cpu.append(used)
                found += got
            case = f"{expansion} / {candidates}"
            results.add(case, size, "recall@10", "", value=found / (10 * len(probes)))
            results.add(case, size, "search p50", "ms", samples=ms(times), keep_samples=False)
            results.add(case, size, "search p50, CPU", "ms", samples=ms(cpu), keep_samples=False)
    finally:
        module.search_depth = default


async def bench(store: VectorStore, name: str, sizes: list[int], dim: int, queries: int, inserts: int,
                depths: list[tuple[int, int]], results: h.Results, sweep: h.Results) -> None:
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((2000, dim), dtype=np.float32)
    blocks: list[np.ndarray[Any, Any]] = []
    have = 0
    sqlite = isinstance(store, SQLiteVectorStore)
    for n in sizes:
        with h.Stopwatch() as loading:
            while have < n:
                batch = min(5000, n - have)
                vectors = clustered(rng, centres, batch)
                blocks.append(vectors)
                await store.upsert("bench", [VectorRecord(f"v{have + i}", vectors[i], f"text {have + i}",
                                                          {"user_id": f"u{(have + i) % 100}"}) for i in range(batch)])
                if have == 0:
                    await store.search("bench", vectors[0], k=1)  # from now on the index follows each upsert
                have += batch
        matrix = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        blocks = [matrix]
        probes = clustered(rng, centres, queries)
        truth = exact_top(matrix, probes, 10)  # before the timed searches (BLAS threads spin for a while)
        times, filtered, found, cpu = [], [], 0, []
        for q, want in zip(probes, truth, strict=True):
            wall, used, got = await timed_search(store, q, want)
            times.append(wall)
            cpu.append(used)
            found += got
            with h.Stopwatch() as watch:
                await store.search("bench", q, k=10, where={"user_id": "u7"})
            filtered.append(watch.wall)
        normal, normal_cpu, graph, full, batched = [], [], [], [], []
        extra = clustered(rng, centres, inserts)
        for i, v in enumerate(extra):  # NORMAL and FULL interleaved, so background load hits both alike
            with h.Stopwatch() as until:  # the upsert, then until the graph has its record
                with h.Stopwatch() as upsert:
                    await store.upsert("bench", [VectorRecord(f"x{have}-{i}", v, "inserted", {"user_id": "new"})])
                if sqlite:
                    await idle(store)
            normal.append(upsert.wall)
            normal_cpu.append(upsert.cpu)
            if sqlite:
                graph.append(until.wall)
                await synchronous(store, "FULL")
                with h.Stopwatch() as watch:
                    await store.upsert("bench", [VectorRecord(f"f{have}-{i}", v, "inserted", {"user_id": "new"})])
                full.append(watch.wall)
                await synchronous(store, "NORMAL")
            if i % 10 == 0:
                with h.Stopwatch() as watch:
                    await store.upsert("bench", [VectorRecord(f"b{have}-{i}-{j}", extra[(i + j) % len(extra)],
                                                              "inserted", {"user_id": "new"}) for j in range(10)])
                batched.append(watch.wall / 10)
        back_to_back = []  # one-record NORMAL upserts with nothing between them
        for i, v in enumerate(extra):
            with h.Stopwatch() as watch:
                await store.upsert("bench", [VectorRecord(f"y{have}-{i}", v, "inserted", {"user_id": "new"})])
            back_to_back.append(watch.wall)
        await store.delete("bench", where={"user_id": "new"})
        size = f"{n:,} x {dim}"
        if sqlite and n == sizes[-1] and depths:
            await depth_sweep(store, probes, truth, depths, size, sweep)
        add = results.add
        add(name, size, "load in batches of 5,000", "s", value=loading.wall)
        add(name, size, "load, CPU", "s", value=loading.cpu)
        add(name, size, "search", "ms", samples=ms(times), keep_samples=False)
        add(name, size, "search, CPU", "ms", samples=ms(cpu), keep_samples=False)
        add(name, size, "search filtered to 1%", "ms", samples=ms(filtered), keep_samples=False)
        add(name, size, "recall@10", "", value=found / (10 * len(probes)))
        add(name, size, "upsert one, NORMAL", "ms", samples=ms(normal), keep_samples=False)
        add(name, size, "upsert one, NORMAL, CPU", "ms", samples=ms(normal_cpu), keep_samples=False)
        if graph:
            add(name, size, "until in the graph", "ms", samples=ms(graph), keep_samples=False)
        add(name, size, "upserts back to back", "ms", samples=ms(back_to_back), keep_samples=False)
        if full:
            add(name, size, "upsert one, FULL", "ms", samples=ms(full), keep_samples=False)
        add(name, size, "ten at once, per record", "ms", samples=ms(batched), keep_samples=False)
        print(f"{name} {n:,}: loaded, searched and upserted", file=sys.stderr, flush=True)
    if sqlite:
        assert isinstance(store, SQLiteVectorStore)
        await store.save_indexes()
        assert store.index_dir is not None
        index_mb = sum(p.stat().st_size for p in store.index_dir.glob("*.usearch")) / 1e6
        db_mb = sum(p.stat().st_size for p in Path(store.path).parent.glob(Path(store.path).name + "*")
                    if p.is_file()) / 1e6
        child = await asyncio.create_subprocess_exec(sys.executable, __file__, "--cold", store.path, "--dim", str(dim),
                                                     stdout=asyncio.subprocess.PIPE)
        cold = json.loads((await child.communicate())[0])
        size = f"{have:,} x {dim}"
        results.add(name, size, "cold start in a new process", "s", value=cold["seconds"], cpu_s=cold["cpu"])
        results.add(name, size, "cold start peak memory", "MB", value=cold["rss_mb"])
        results.add(name, size, "index file", "MB", value=index_mb)
        results.add(name, size, "database file", "MB", value=db_mb)


def load_other(src: str) -> Any:
    """Import the ``contextpipe`` package under `src` as ``contextpipe_against`` (its vectors module)."""
    init = Path(src) / "contextpipe" / "__init__.py"
    spec = importlib.util.spec_from_file_location("contextpipe_against", init,
                                                  submodule_search_locations=[str(init.parent)])
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["contextpipe_against"] = module
    spec.loader.exec_module(module)
    return importlib.import_module("contextpipe_against.vectors")


def copy_store(base: Path, path: Path) -> Path:
    """Copy the database at `base` (with its WAL and saved indexes) to `path`."""
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{base}{suffix}").exists():
            shutil.copy(f"{base}{suffix}", f"{path}{suffix}")
    shutil.copytree(f"{base}.vectors", f"{path}.vectors")
    return path


def remove_store(path: Path) -> None:
    """Delete the database at `path` with its WAL and saved indexes."""
    for leftover in path.parent.glob(path.name + "*"):
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()


async def against(src: str, n: int, dim: int, queries: int, rounds: int, results: h.Results) -> None:
    other = load_other(src)
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((2000, dim), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.db"
        store = SQLiteVectorStore(base)
        blocks = []
        for start in range(0, n, 5000):
            vectors = clustered(rng, centres, min(5000, n - start))
            blocks.append(vectors)
            await store.upsert("bench", [VectorRecord(f"v{start + i}", v, f"text {start + i}",
                                                      {"user_id": f"u{i % 100}"}) for i, v in enumerate(vectors)])
        await store.search("bench", blocks[0][0], k=1)
        await store.close()  # (saves the index: each side loads it)
        matrix, probes = np.concatenate(blocks), clustered(rng, centres, queries)
        truth = exact_top(matrix, probes, 10)
        names, modules = ["this", "against"], {"this": sys.modules["contextpipe.vectors"], "against": other}
        times: dict[str, dict[str, list[float]]] = {name: {"search": [], "cold": [], "upsert": [], "graph": []}
                                                    for name in names}
        found = dict.fromkeys(names, 0)
        for r in range(rounds):
            # Each round opens fresh copies, the two sides in turn first: with the same code on both
            # sides, the side opened first measured about 6% slower, whichever it was.
            sides: dict[str, Any] = {}
            for name in h.rotated(names, r):
                path = copy_store(base, Path(tmp) / f"{name}{r}.db")
                sides[name] = (modules[name], modules[name].SQLiteVectorStore(path))
                await sides[name][1].search("bench", probes[0], k=10)
            for i, q in enumerate(probes):
                for name in h.rotated(names, i + r):
                    with h.Stopwatch() as watch:
                        hits = await sides[name][1].search("bench", q, k=10)
                    times[name]["search"].append(watch.cpu)
                    if r == 0:
                        found[name] += len(truth[i] & {int(hit.id[1:]) for hit in hits})
            for i, q in enumerate(probes):
                for name in h.rotated(names, i + r):
                    await sides[name][1].search("bench", q, k=10, where={"user_id": "u7"})
                    with h.Stopwatch() as watch:
                        await sides[name][1].search("bench", q, k=10)
                    times[name]["cold"].append(watch.cpu)
            for i in range(queries):
                vector = matrix[(i * 7919 + r) % len(matrix)] + 0.01
                for name in h.rotated(names, i + r):
                    module, side = sides[name]
                    record = module.VectorRecord(f"x{r}-{i}", vector, "inserted", {"user_id": "new"})
                    with h.Stopwatch() as until:
                        with h.Stopwatch() as upsert:
                            await side.upsert("bench", [record])
                        await idle(side)  # (outside the timed upsert: the other side's is next)
                    times[name]["upsert"].append(upsert.cpu)
                    times[name]["graph"].append(until.cpu)
            for name, (_, side) in sides.items():
                await side.close()
                remove_store(Path(tmp) / f"{name}{r}.db")
        label = {"this": "this tree", "against": f"against ({h.git_commit(Path(src)) or src})"}
        for name in names:
            side = label[name]
            results.add("search", side, "CPU", "ms", samples=ms(times[name]["search"]), keep_samples=False)
            results.add("search", side, "recall@10", "", value=found[name] / (10 * queries))
            results.add("search right after a filtered one", side, "CPU", "ms", samples=ms(times[name]["cold"]),
                        keep_samples=False)
            results.add("upsert one", side, "CPU", "ms", samples=ms(times[name]["upsert"]), keep_samples=False)
            results.add("upsert one until in the graph", side, "CPU", "ms", samples=ms(times[name]["graph"]),
                        keep_samples=False)
        for case in ("search", "search right after a filtered one", "upsert one", "upsert one until in the graph"):
            results.ratio(case, "CPU", side=label["this"], over=label["against"])


def p50_us(work: Any, sides: dict[str, Any], rounds: int) -> dict[str, float]:
    """Wall-clock p50 in µs of each side's ``work(side, i)``, the sides alternated call by call."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(rounds):
        for name in h.rotated(names, i):
            with h.Stopwatch() as watch:
                work(sides[name], i)
            times[name].append(watch.wall)
    return {name: h.stats(t)["median"] * 1e6 for name, t in times.items()}


async def seams(n: int, dim: int, queries: int) -> None:
    """What each fast path of the store buys over the plain version beside it, on one collection of `n`."""
    import random

    from contextpipe.vectors import _hnsw, _keywords

    rng = np.random.default_rng(7)
    centres = rng.standard_normal((2000, dim), dtype=np.float32)
    words = random.Random(1)
    vocabulary = [f"w{i}" for i in range(2000)]
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteVectorStore(Path(tmp) / "seams.db")
        for start in range(0, n, 5000):
            vectors = clustered(rng, centres, min(5000, n - start))
            await store.upsert("bench", [VectorRecord(f"v{start + i}", v, " ".join(words.choices(vocabulary, k=12)),
                                                      {"user_id": f"u{i % 100}"}) for i, v in enumerate(vectors)])
        probes = clustered(rng, centres, queries)
        await store.search("bench", probes[0], k=10)
        c = store._cache["bench"]
        expansion, want = _hnsw.search_depth(len(c.records), 10)
        c.index.expansion_search = expansion
        search = _hnsw.IndexSearch()
        keys = p50_us(lambda way, i: way(probes[i % queries]), {
            "compiled": lambda q: search.keys(c.index, q, want, False),
            "public": lambda q: _hnsw.public_search(c.index, q, want, False)[0].tolist()}, 6 * queries)
        top = p50_us(lambda way, i: way(probes[i % queries]), {
            "graph": lambda q: _hnsw.approximate_top(c, q, 10, None, search),
            "exact": lambda q: _hnsw.exact_top(c, q, 10, None)}, min(queries, 100))
        print(f"{n:,} x {dim}, wall p50, alternated: keys from the graph (top {want}) compiled "
              f"{keys['compiled']:,.1f} µs, public {keys['public']:,.1f} µs; top 10 through the graph "
              f"{top['graph']:,.0f} µs, exact {top['exact']:,.0f} µs", flush=True)

        def keyword(conn: Any, where: Any) -> dict[str, float]:
            table = store._keyword_tables.table(conn, "bench")
            held = store._indexes.sync(conn, "bench")
            asked = [_keywords.fts_query(words.sample(vocabulary, 2)) for _ in range(queries)]
            return p50_us(lambda way, i: way(asked[i % queries]), {
                "held": lambda q: _keywords.search_held(conn, held, table, q, 10, where),
                "rows": lambda q: _keywords.search_rows(conn, table, "bench", q, 10, where)}, 2 * queries)

        for where in (None, {"user_id": "u7"}):
            found = await store._run(keyword, where)
            print(f"keyword top 10 of two words, where={where}: from the held index {found['held']:,.0f} µs, "
                  f"from the rows {found['rows']:,.0f} µs", flush=True)
        await store.close()


def peak_mb() -> float:
    """This process's peak resident memory.

    Not getrusage's ``ru_maxrss`` where avoidable: Linux carries it over fork and exec, so in the cold-start
    child it reports the benchmark's own process (which holds the collection twice); ``VmHWM`` is the
    peak of this process image alone.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def cold_start(path: str, dim: int) -> None:
    with h.Stopwatch() as watch:
        store = SQLiteVectorStore(path)
        await store.search("bench", [1.0] * dim, k=10)
    rss_mb = peak_mb()
    await store.close()
    print(json.dumps({"seconds": watch.wall, "cpu": watch.cpu, "rss_mb": rss_mb}))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="sizes the collection grows through, in order")
    parser.add_argument("--size", type=int, default=None, help="one size (same as --sizes N)")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--inserts", type=int, default=200)
    parser.add_argument("--depths", default="64:40,128:40,256:100,512:200,1024:400",
                        help="search depths (expansion:candidates) also measured at the largest size; '' for none")
    parser.add_argument("--pgvector", default=None, help="DSN of a PostgreSQL server with pgvector")
    parser.add_argument("--pgvector-sizes", default="10000")
    parser.add_argument("--against", default=None, help="the src directory of another checkout to compare with")
    parser.add_argument("--rounds", type=int, default=2, help="with --against: passes over the queries")
    parser.add_argument("--seams", action="store_true",
                        help="what each fast path buys over its plain version, at the largest size")
    parser.add_argument("--cold", default=None, help=argparse.SUPPRESS)  # the cold-start child process
    h.out_argument(parser, "vectors")
    args = parser.parse_args()
    if args.cold:
        await cold_start(args.cold, args.dim)
        return
    sizes = [args.size] if args.size else [int(s) for s in args.sizes.split(",")]
    if args.against:
        ref = h.git_commit(Path(args.against))
        results = h.Results("vectors-against", "SQLiteVectorStore against another tree's, in one process on copies "
                            "of one file: the same searches and one-record upserts alternating between the sides, "
                            f"CPU p50 per operation, {sizes[-1]:,} x {args.dim}",
                            reference={"name": f"another tree ({ref or args.against})", "commit": ref})
        await against(args.against, sizes[-1], args.dim, args.queries, args.rounds, results)
        print(h.table(results.write(args.out)))
        return
    if args.seams:
        await seams(sizes[-1], args.dim, args.queries)
        return
    what = ("384-dimension vectors drawn as 2,000 clustered Gaussians shaped like sentence embeddings, top 10; "
            "p50 unless said otherwise; recall@10 against exact search")
    layout = {"rows": ["metric", "case"], "columns": "side"}
    results = h.Results("vectors", f"The embedded vector store as it grows: {what}", layout=layout)
    sweep = h.Results("vectors-depths", f"The same searches at other search depths (expansion / candidates "
                      f"re-scored): {what}", layout={"rows": ["case", "side"], "columns": "metric"})
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteVectorStore(Path(tmp) / "vectors.db")
        depths = [(int(d.split(":")[0]), int(d.split(":")[1])) for d in args.depths.split(",") if d]
        await bench(store, "SQLite + usearch HNSW", sizes, args.dim, args.queries, args.inserts, depths, results,
                    sweep)
        await store.close()
    if args.pgvector:
        from contextpipe.vectors.pgvector import PgVectorStore

        pg = PgVectorStore(args.pgvector, table=f"bench{int(time.time())}")
        await bench(pg, "pgvector (HNSW)", [int(x) for x in args.pgvector_sizes.split(",")], args.dim, args.queries,
                    args.inserts, [], results, sweep)
        await pg.close()
    print(h.table(results.write(args.out)))
    if sweep.doc["results"]:
        out = args.out.with_name(args.out.stem + "-depths.json") if args.out else None
        print(h.table(sweep.write(out)))


if __name__ == "__main__":
    asyncio.run(main())

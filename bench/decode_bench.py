"""Decoding a stored log: the stores' fast batch decoders against the plain decoders, and two trees against each other.

A log of 10,000 messages of a realistic mix (user turns, assistant text, tool calls and results,
each with its source as the loop tags them, and one message in twenty with several parts, an author
or metadata) is encoded as the stores keep it:

- ``compact arrays``: the compact form read as JSON arrays of 4,096 (SQLite's joined read, `loads_arrays`);
- ``full rows``: the full form one row each (PostgreSQL, `loads_many`);
- ``full rows unsourced``: the same without sources, the shapes the full form's fast path builds;
- ``plain compact`` / ``plain full`` / ``plain full unsourced``: the same texts decoded one by one by
  the plain decoders (`loads_stored`), the reference the fast paths must equal.

Each figure is the best of `--repeat` timings of the process's CPU time (steadier than the wall clock
on a shared machine), in milliseconds for the whole log.

    python bench/decode_bench.py                      # this tree, one process
    python bench/decode_bench.py --compare OTHER_TREE/src src --rounds 8 --out bench/results/decode.json

`--compare` runs this script under each ``src`` directory in turn (PYTHONPATH), interleaved round
by round, and reports each tree's best and median round and the ratios of the best to the first tree's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import _harness as h
import contextpipe.stores._common  # noqa: F401 - loaded as in a store's process, so every tree has the same objects
from contextpipe.messages import FunctionCall, FunctionResult, Message, Source, TextPart

try:  # this tree
    from contextpipe.codec import dumps
    from contextpipe.stores._fastdecode import dumps_compact, loads_arrays, loads_many, loads_stored
except ImportError:  # a tree from before the split, where the codec lived in contextpipe.messages
    from contextpipe.messages import (  # type: ignore[attr-defined, no-redef]
        dumps,
        dumps_compact,
        loads_arrays,
        loads_many,
    )
    from contextpipe.messages import loads as loads_stored  # type: ignore[attr-defined, no-redef]

N = 10_000
ARRAY = 4096  # messages per joined value in SQLite's read


def make_log(n: int = N) -> list[Message]:
    """A conversation of `n` messages: turns of user text, a tool call and its result, and the answer."""
    model, tool = Source("model", "gpt-4o-mini"), Source("tool", "get_weather_forecast")
    log: list[Message] = []
    t = 1_700_000_000.0
    for i in range(n):
        t += 0.37
        step, call_id = i % 4, f"call_{i // 4:06d}"
        if step == 0:
            m = Message.user(f"What should I wear in Suzhou on day {i}? It may rain after lunch.", created_at=t,
                             source=Source("input"))
        elif step == 1:
            m = Message("assistant", (FunctionCall(call_id, "get_weather_forecast", f'{{"location_code": "SZ{i}"}}'),),
                        created_at=t, source=model)
        elif step == 2:
            m = Message("tool", (FunctionResult(call_id, f"Sunny, {20 + i % 10} C, NW wind 4."),), created_at=t,
                        source=tool)
        else:
            m = Message.assistant("Sunny and warm: a T-shirt and light trousers, and sunglasses. " * 2,
                                  created_at=t, source=model)
        if i % 20 == 19:  # the rarer shapes: several parts, an author, metadata
            m = Message("assistant", (TextPart("Checking the forecast."), FunctionCall(call_id, "f", "{}")),
                        author_name="planner", created_at=t, metadata={"run": f"r{i}"}, source=model)
        log.append(m)
    return log


def _best(fn: Callable[[], Any], repeat: int) -> float:
    """CPU ms of the fastest of `repeat` calls, each after a full collection (untimed)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        times.append(h.measure(fn, 1, warmup=0)[0].cpu)
    return min(times) * 1000


def run(repeat: int) -> dict[str, float]:
    """Time each decoding of the log once (best of `repeat`), checking first that each decodes it exactly."""
    log = make_log()
    compact = [dumps_compact(m) for m in log]
    full = [dumps(m) for m in log]
    unsourced_log = [Message(m.role, m.parts, m.id, m.author_name, m.created_at, m.metadata) for m in log]
    unsourced = [dumps(m) for m in unsourced_log]
    arrays = ["[" + ",".join(compact[i:i + ARRAY]) + "]" for i in range(0, N, ARRAY)]
    cases: dict[str, Callable[[], list[Message]]] = {
        "compact arrays": lambda: [m for a in loads_arrays(arrays) for m in a],
        "full rows": lambda: loads_many(full),
        "full rows unsourced": lambda: loads_many(unsourced),
        "plain compact": lambda: [loads_stored(t) for t in compact],
        "plain full": lambda: [loads_stored(t) for t in full],
        "plain full unsourced": lambda: [loads_stored(t) for t in unsourced],
    }
    for name, decode in cases.items():
        assert decode() == (unsourced_log if "unsourced" in name else log), name
    return {name: round(_best(decode, repeat), 3) for name, decode in cases.items()}


def compare(trees: list[str], rounds: int, repeat: int) -> dict[str, Any]:
    """Run `run` under each tree, interleaved, `rounds` times; the median per tree and the ratios to the first."""
    samples: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    for _, order in h.interleave(trees, rounds):
        for tree in order:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            out = subprocess.run([sys.executable, __file__, "--repeat", str(repeat)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            samples[tree].append(json.loads(out))
    best = {tree: {case: min(s[case] for s in runs) for case in runs[0]} for tree, runs in samples.items()}
    medians = {tree: {case: h.stats([s[case] for s in runs])["median"] for case in runs[0]}
               for tree, runs in samples.items()}
    first = best[trees[0]]
    return {
        "what": f"CPU ms to decode a stored log of {N:,} messages, the best of {repeat} per round, {rounds} rounds",
        "python": platform.python_version(),
        "trees": trees,
        "best_ms": best,
        "median_ms": medians,
        "ratio_to_first": {tree: {case: round(m[case] / first[case], 3) for case in m} for tree, m in best.items()},
        "fast_vs_plain": {tree: {"compact": round(m["plain compact"] / m["compact arrays"], 2),
                                 "full": round(m["plain full"] / m["full rows"], 2),
                                 "full unsourced": round(m["plain full unsourced"] / m["full rows unsourced"], 2)}
                          for tree, m in best.items()},
        "samples_ms": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--compare", nargs="+", metavar="SRC", help="src directories to compare, interleaved")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", help="write the comparison as JSON here")
    args = parser.parse_args()
    if not args.compare:
        print(json.dumps(run(args.repeat)))
        return
    result = compare(args.compare, args.rounds, args.repeat)
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps({k: result[k] for k in ("best_ms", "ratio_to_first", "fast_vs_plain")}, indent=2))


if __name__ == "__main__":
    main()

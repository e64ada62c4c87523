#!/usr/bin/env python3
"""MAF's linear `SlidingWindowStrategy` on the baseline's W5 data (workload ``W5-sliding``), for ``compare.py``.

Runs in the MAF virtualenv and reuses the shared baseline harness (its history, timing and checks), so
the numbers are measured exactly like the baseline's W5 (which uses the quadratic `TruncationStrategy`).
The window keeps the newest half of the N messages (each plain message is its own group).

    bench/.venv-maf/bin/python bench/maf_sliding.py --maf-bench ../shared/bench/maf_bench.py > sliding.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

W5_NS = [100, 1000, 10000]


def load_harness(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("maf_bench", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["maf_bench"] = module
    spec.loader.exec_module(module)
    return module


async def sliding(mb: Any) -> None:
    from agent_framework._compaction import CharacterEstimatorTokenizer, SlidingWindowStrategy, apply_compaction

    tokenizer = CharacterEstimatorTokenizer()
    for n in W5_NS:
        strategy = SlidingWindowStrategy(keep_last_groups=n // 2)
        holder: dict[str, Any] = {}

        def setup(n: int = n, holder: dict[str, Any] = holder) -> None:
            holder["msgs"] = mb.make_history(n)

        async def op(strategy: Any = strategy, holder: dict[str, Any] = holder) -> None:
            holder["out"] = await apply_compaction(holder["msgs"], strategy=strategy, tokenizer=tokenizer)

        def check(n: int = n, holder: dict[str, Any] = holder) -> dict[str, Any]:
            mb.expect(len(holder["out"]) == n - n // 2, f"W5-sliding kept {len(holder['out'])} of {n}")
            return {"kept_messages": len(holder["out"])}

        await mb.measure("W5-sliding", f"N={n} cold (fresh list)", op, setup=setup, check=check,
                         params={"N": n, "strategy": "SlidingWindowStrategy", "keep_last_groups": n // 2},
                         min_iters=3 if n >= 10000 else 20, target_s=2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--maf-bench", type=Path, required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    mb = load_harness(args.maf_bench)
    mb.ARGS = argparse.Namespace(scale=args.scale, only="W5", skip_notel=True)
    asyncio.run(sliding(mb))
    from importlib import metadata

    json.dump({"framework": "agent-framework-core", "framework_version": metadata.version("agent-framework-core"),
               "results": mb.RESULTS}, sys.stdout, indent=2)


if __name__ == "__main__":
    main()

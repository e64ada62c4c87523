#!/usr/bin/env python3
"""Run the MAF reference harness and contextpipe's on this machine, interleaved, and print ratios.

    python bench/compare.py                      # full run (2 rounds, several minutes)
    python bench/compare.py --scale 0.3 --rounds 1   # quicker, noisier
    python bench/compare.py --maf-python /path/to/venv/bin/python
    python bench/compare.py --before /tmp/cp-before --only W1,W3   # contextpipe against an earlier tree of itself
    python bench/compare.py --scale 0.5 --rounds 1 --out bench/results/maf-in-memory.json

With ``--before DIR`` (a contextpipe source tree, e.g. ``git archive af1a54e | tar -x -C /tmp/cp-before``) the
reference side is this same harness run on that tree (its ``src`` first on the ``PYTHONPATH``) instead of MAF,
interleaved in the same way: the speed-up column is then before / after.

The reference runs in its own virtualenv (``bench/.venv-peer-maf`` by default, made by ``bash
bench/peers/setup.sh`` when missing, shared with bench/peers); contextpipe runs in this interpreter. The
reference harness is ``maf_bench.py`` from the shared bench folder (``--maf-bench``), plus ``maf_sliding.py`` for MAF's
linear ``SlidingWindowStrategy`` (``W5-sliding``). The two sides are interleaved: each workload runs
on both sides in turn, the side going first alternating from workload to workload and round to round,
so background load cannot favour one; a case's figure is the median of its per-round medians.

The headline is like for like: contextpipe's messages always carry ids, so W1 is compared with the
reference's ``W1-ids`` case (MAF deduplicates messages without ids by serialising every one of them,
which is what its plain W1 measures; that ratio is shown too, marked as such).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import _harness as h

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKLOADS = "W0,W1,W2,W3,W4,W5,W5-sliding,W6"


def ensure_maf_python(path: Path | None) -> Path:
    if path is not None:
        return path
    python = HERE / ".venv-peer-maf" / "bin" / "python"  # the same virtualenv as bench/peers uses
    if not python.exists():
        subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], check=True)
    return python


def run(cmd: list[str], label: str, pythonpath: Path | None = None) -> dict[str, Any]:
    print(f"running {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    env = None
    if pythonpath is not None:
        paths = [str(pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, env=env)
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def default_maf_bench() -> Path:
    """The shared folder's harness, beside the checkout or beside the folder of worktrees holding it."""
    for base in (REPO.parent, REPO.parent.parent):
        candidate = base / "shared" / "bench" / "maf_bench.py"
        if candidate.exists():
            return candidate
    return REPO.parent / "shared" / "bench" / "maf_bench.py"


def medians(runs: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Median over rounds of each case's median."""
    per_case: dict[tuple[str, str], list[float]] = {}
    for data in runs:
        for r in data["results"]:
            per_case.setdefault((r["workload"], r["case"]), []).append(r["median_us"])
    return {key: h.stats(values)["median"] for key, values in per_case.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--maf-python", type=Path, default=None, help="python of a venv with the reference")
    parser.add_argument("--maf-bench", type=Path, default=default_maf_bench(),
                        help="the shared baseline harness (default: shared/bench/maf_bench.py beside the checkout)")
    parser.add_argument("--only", default=WORKLOADS, help="comma-separated workloads")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply per-case time targets (both sides)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (each runs every workload twice)")
    parser.add_argument("--json", type=Path, default=None, help="also write both raw results to this file")
    h.out_argument(parser, "maf-in-memory")
    parser.add_argument("--before", type=Path, default=None,
                        help="a contextpipe source tree to compare against instead of MAF")
    args = parser.parse_args()

    maf_python = ensure_maf_python(args.maf_python) if args.before is None else Path(sys.executable)
    before_src = args.before / "src" if args.before is not None else None
    scale = ["--scale", str(args.scale)]
    results = h.Results(
        "maf-in-memory", f"In-memory framework overhead on the workloads of MAF's baseline harness (no LLM, no "
        f"store), the sides alternating workload by workload, {args.rounds} round(s) at --scale {args.scale}; "
        "median µs per operation")
    ref_runs: list[dict[str, Any]] = []
    our_runs: list[dict[str, Any]] = []
    turn = 0
    for _ in range(args.rounds):
        for workload in args.only.split(","):
            our_cmd = [sys.executable, str(HERE / "contextpipe_bench.py"), "--only", workload, *scale]
            if before_src is not None:
                if workload == "W5-sliding":
                    continue
                ref_cmd, ref_label = our_cmd, f"before ({args.before}) {workload}"
            elif workload == "W5-sliding":
                ref_cmd = [str(maf_python), str(HERE / "maf_sliding.py"), "--maf-bench", str(args.maf_bench), *scale]
                ref_label = f"reference (MAF) {workload}"
            else:
                ref_cmd = [str(maf_python), str(args.maf_bench), "--only", workload, *scale]
                ref_label = f"reference (MAF) {workload}"
            sides = [(ref_cmd, ref_label, ref_runs, before_src), (our_cmd, f"contextpipe {workload}", our_runs, None)]
            for cmd, label, into, path in h.rotated(sides, turn):
                into.append(run(cmd, label, path))
            turn += 1
    if args.json is not None:
        args.json.write_text(json.dumps({"reference": ref_runs, "contextpipe": our_runs}, indent=2))

    ref, cp = medians(ref_runs), medians(our_runs)
    reference = next(r for r in ref_runs if "framework" in r)
    rows: list[tuple[str, str, float | None, float, str]] = []
    for (workload, case), value in cp.items():
        ref_case = case.removesuffix(" inline")
        note = "tool runs on the event loop, as the reference's sync tools do" if case.endswith(" inline") else ""
        if before_src is not None:
            rows.append((workload, case, ref.get((workload, case)), value, f"before: {args.before}"))
            continue
        if workload == "W1":
            like = ref.get(("W1-ids", case))
            if like is not None:
                rows.append(("W1", case, like, value, "like for like: the reference's history has ids too"))
            base = ref.get(("W1", case))
            rows.append(("W1", f"{case} vs reference without ids", base, value,
                         "reference deduplicates id-less messages by serialising each"))
            if ("W1-notel", case) in ref:
                rows.append(("W1", f"{case} vs reference without telemetry", ref[("W1-notel", case)], value, ""))
            continue
        base = ref.get((workload, ref_case))
        if workload == "W4":
            note = "reference: whole session to_dict/from_dict; contextpipe: message codec"
        if workload == "W5":
            note = "reference: TruncationStrategy (quadratic)"
        if workload == "W5-sliding":
            note = "reference: SlidingWindowStrategy (linear); contextpipe: SlidingWindow"
        rows.append((workload, case, base, value, note))

    ref_name = "before" if before_src is not None else f"{reference['framework']} {reference['framework_version']}"
    results.doc["reference"] = {"name": ref_name, "commit": h.git_commit(args.before) if args.before else None}
    for workload, case, base, value, note in rows:
        label = f"{workload} {case}"
        results.add(label, "contextpipe", "median", "µs", value=value, note=note)
        if base:
            results.add(label, ref_name, "median", "µs", value=base, note=note)
            results.ratio(label, "median", side=ref_name, over="contextpipe")
    print(h.table(results.write(args.out)))

    per_chunk = [r.get("derived", {}).get("w6_framework_us_per_stream_chunk") for r in our_runs]
    ref_chunk = [r.get("derived", {}).get("w6_framework_us_per_stream_chunk") for r in ref_runs]
    ours_w6 = [v for v in per_chunk if v is not None]
    ref_w6 = [v for v in ref_chunk if v is not None]
    if ours_w6 and ref_w6:
        print(f"\ncontextpipe W6 framework cost per stream chunk: {h.stats(ours_w6)['median']} µs "
              f"(reference: {h.stats(ref_w6)['median']} µs)")
    memory = next((r["memory_w1_n10000"] for r in our_runs if r.get("memory_w1_n10000")), None)
    ref_memory = next((r["memory_w1_n10000"] for r in ref_runs if r.get("memory_w1_n10000")), None)
    if memory and ref_memory:
        print(f"W1 N=10000 run peak above pre-run: contextpipe {memory['run_peak_bytes_above_pre_run']:,} B, "
              f"reference {ref_memory['run_peak_bytes_above_pre_run']:,} B")


if __name__ == "__main__":
    main()

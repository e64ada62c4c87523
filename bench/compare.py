#!/usr/bin/env python3
"""Run the MAF reference harness and contextpipe's on this machine, one after the other, and print ratios.

    python bench/compare.py                      # full run (about 2 minutes each side)
    python bench/compare.py --scale 0.3          # quicker, noisier
    python bench/compare.py --maf-python /path/to/venv/bin/python

The reference runs in its own virtualenv (``bench/.venv-maf`` by default, created on first use with
``agent-framework-core==1.23.0``); contextpipe runs in this interpreter. The reference harness is
``maf_bench.py`` from the shared bench folder (``--maf-bench``). Both write JSON; this script joins
them by workload and case and prints a Markdown table of medians and speed-ups (reference / ours).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MAF_VERSION = "agent-framework-core==1.23.0"
WORKLOADS = "W0,W1,W2,W3,W4,W5,W6"


def ensure_maf_python(path: Path | None) -> Path:
    if path is not None:
        return path
    venv = HERE / ".venv-maf"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with {MAF_VERSION} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", MAF_VERSION], check=True)
    return python


def run(cmd: list[str], label: str) -> dict[str, Any]:
    print(f"running {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def medians(data: dict[str, Any]) -> dict[tuple[str, str], float]:
    return {(r["workload"], r["case"]): r["median_us"] for r in data["results"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--maf-python", type=Path, default=None, help="python of a venv with the reference")
    parser.add_argument("--maf-bench", type=Path, default=REPO.parent / "shared" / "bench" / "maf_bench.py")
    parser.add_argument("--only", default=WORKLOADS, help="comma-separated workloads")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply per-case time targets (both sides)")
    parser.add_argument("--json", type=Path, default=None, help="also write both raw results to this file")
    args = parser.parse_args()

    maf_python = ensure_maf_python(args.maf_python)
    reference = run([str(maf_python), str(args.maf_bench), "--only", args.only, "--scale", str(args.scale)],
                    "reference (MAF)")
    ours = run([sys.executable, str(HERE / "contextpipe_bench.py"), "--only", args.only, "--scale", str(args.scale)],
               "contextpipe")
    if args.json is not None:
        args.json.write_text(json.dumps({"reference": reference, "contextpipe": ours}, indent=2))

    ref, cp = medians(reference), medians(ours)
    rows: list[tuple[str, str, float | None, float, str]] = []
    for (workload, case), value in cp.items():
        ref_case = case.removesuffix(" inline")
        base = ref.get((workload, ref_case))
        note = "tool runs on the event loop, as the reference's sync tools do" if case.endswith(" inline") else ""
        if workload == "W4":
            note = "reference: whole session to_dict/from_dict; contextpipe: message codec"
        rows.append((workload, case, base, value, note))
        if workload == "W1" and (("W1-notel", case) in ref):
            rows.append(("W1", f"{case} vs reference without telemetry", ref[("W1-notel", case)], value, ""))

    print(f"\nreference: {reference['framework']} {reference['framework_version']}, "
          f"contextpipe {ours['framework_version']}, Python {ours['machine']['python']}, "
          f"nproc {ours['machine']['nproc']}, scale {args.scale}\n")
    print("| workload | case | reference median µs | contextpipe median µs | speed-up | note |")
    print("|---|---|---:|---:|---:|---|")
    for workload, case, base, value, note in rows:
        ratio = f"{base / value:,.1f}x" if base else "n/a"
        base_text = f"{base:,.1f}" if base else "n/a"
        print(f"| {workload} | {case} | {base_text} | {value:,.1f} | {ratio} | {note} |")

    derived = ours.get("derived", {})
    per_chunk = derived.get("w6_framework_us_per_stream_chunk")
    print()
    print(f"contextpipe W6 framework cost per stream chunk: {per_chunk} µs "
          f"(reference: {reference.get('derived', {}).get('w6_framework_us_per_stream_chunk')} µs)")
    memory = ours.get("memory_w1_n10000")
    ref_memory = reference.get("memory_w1_n10000")
    if memory and ref_memory:
        print(f"W1 N=10000 run peak above pre-run: contextpipe {memory['run_peak_bytes_above_pre_run']:,} B, "
              f"reference {ref_memory['run_peak_bytes_above_pre_run']:,} B")


if __name__ == "__main__":
    main()

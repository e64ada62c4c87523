"""What every benchmark here shares: clocks, medians and spread, interleaved sides, the load, JSON results.

Standard library only, so the peers' workers (each in its own virtualenv) and an earlier tree's
workers can import it too. A script measures, then writes one results file:

    results = Results("overhead", "The run core's own cost per run and per step", reference={...})
    for turn, order in interleave(["before", "after"], rounds=3):
        for side in order:
            results.add("W1", side, "cpu", "µs", samples=[...])
    results.ratio("W1", "cpu", side="before", over="after")
    results.write(args.out)

The results file (``bench/results/NAME.json``; ``docs/hooks/results.py`` renders it as a table):

- ``schema``: 1; ``benchmark``: NAME; ``description``: what is measured, against whom;
- ``command``: the one command that wrote it; ``date`` (ISO 8601, UTC); ``commit``: the tree measured;
- ``reference``: what it is compared with (``{"name": ..., "commit": ...}``, peers' versions), or null;
- ``machine``: ``cpus``, ``python``, ``platform``, ``load_before`` / ``load_after`` (``os.getloadavg``);
- ``source``: ``"measured"`` when this harness wrote it, or where transcribed figures come from
  (``"transcribed from README.md at commit 89bd5b5"``), with ``original``: ``date`` and ``commit``
  (when and in which commit the source got the figures), ``load`` and ``command`` as it gave them;
- ``results``: rows ``{"case", "side", "metric", "unit", "value", "stats"?, "samples"?}``: ``value`` is
  the median of the samples (their spread in ``stats``), or a single figure (a count, a computed or
  transcribed value) when there are none; other keys a script adds stay beside them;
- ``ratios``: rows ``{"case", "metric", "side", "over", "value"}``, ``value`` = side / over;
- optional ``notes`` (sentences shown under the table) and ``layout``: which of case, side and
  metric make a table's rows and which its columns (default ``{"rows": ["case", "metric"],
  "columns": "side"}``).

On a shared machine absolute figures move with the load; the sides of a comparison are therefore
interleaved (``interleave``) so that load falls on all of them, and ratios are the figures to trust.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SCHEMA = 1
KEYS = ("case", "side", "metric")
DEFAULT_LAYOUT: dict[str, Any] = {"rows": ["case", "metric"], "columns": "side"}
T = TypeVar("T")


class Sample(NamedTuple):
    """One timed operation: wall seconds (``perf_counter``) and CPU seconds of this process (all threads)."""

    wall: float
    cpu: float


class Stopwatch:
    """``with Stopwatch() as t: ...`` then ``t.wall`` and ``t.cpu`` (seconds), for timing a block in place.

    CPU time is the process's (all threads) unless another clock is given (``time.thread_time``: this
    thread's alone, when other threads' work must not count).
    """

    wall = 0.0
    cpu = 0.0

    def __init__(self, cpu_clock: Callable[[], float] = time.process_time) -> None:
        self._clock = cpu_clock

    def __enter__(self) -> Stopwatch:
        self._cpu, self._wall = self._clock(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = self._clock() - self._cpu

    @property
    def sample(self) -> Sample:
        """The block's wall and CPU seconds as one `Sample`."""
        return Sample(self.wall, self.cpu)


def measure(op: Callable[[], object], repeat: int, warmup: int = 1) -> list[Sample]:
    """Call `op` `warmup` times untimed (first-use costs), then `repeat` times, each timed."""
    for _ in range(warmup):
        op()
    out = []
    for _ in range(repeat):
        with Stopwatch() as watch:
            op()
        out.append(watch.sample)
    return out


async def ameasure(op: Callable[[T], Awaitable[object]], repeat: int, warmup: int = 1,
                   setup: Callable[[], Awaitable[T]] | None = None) -> list[Sample]:
    """Await ``op(await setup())`` like `measure`; `setup` (untimed) makes each call's argument."""

    async def once() -> Sample:
        arg: Any = await setup() if setup is not None else None
        with Stopwatch() as watch:
            await op(arg)
        return watch.sample

    for _ in range(warmup):
        await once()
    return [await once() for _ in range(repeat)]


def child_cost(argv: Sequence[str], env: dict[str, str] | None = None, **run: Any) -> tuple[Sample, str]:
    """Run a new process to its end: its wall time and its CPU time (user + system, ``getrusage``), and stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, check=True, stdout=subprocess.PIPE, text=True, **run)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return Sample(wall, cpu), proc.stdout


def stats(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of `values`: min, quartiles, 95th percentile, max and count."""
    ordered = sorted(values)
    if len(ordered) == 1:
        q1 = q3 = p95 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
        p95 = statistics.quantiles(ordered, n=20, method="inclusive")[18]
    return {"median": statistics.median(ordered), "min": ordered[0], "p25": q1, "p75": q3, "p95": p95,
            "max": ordered[-1], "n": len(ordered)}


def rotated(items: Sequence[T], turn: int) -> list[T]:
    """`items` rotated by `turn` places: each side goes first in turn (for two sides, alternation)."""
    k = turn % len(items) if items else 0
    return [*items[k:], *items[:k]]


def interleave(sides: Sequence[T], rounds: int) -> Iterator[tuple[int, list[T]]]:
    """For each round, the round's number and the sides in that round's order (rotating)."""
    for r in range(rounds):
        yield r, rotated(sides, r)


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def git_commit(tree: Path = ROOT) -> str | None:
    """The short commit of `tree`'s checkout (``+dirty`` when it has uncommitted changes), or None."""
    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)bench/results"],  # results being written do not make the code dirty
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """CPU count, Python version and platform of this machine, and its load now."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_before": load()}


def command() -> str:
    """How this process was started, as one would type it from the repository root."""
    script = Path(sys.argv[0])
    with contextlib.suppress(ValueError):
        script = script.resolve().relative_to(ROOT)
    return shlex.join(["python", str(script), *sys.argv[1:]])


class Results:
    """One benchmark's results file being filled: rows, ratios, and where and when they were measured."""

    def __init__(self, benchmark: str, description: str, reference: dict[str, Any] | None = None,
                 notes: Sequence[str] = (), layout: dict[str, Any] | None = None) -> None:
        self.doc: dict[str, Any] = {
            "schema": SCHEMA, "benchmark": benchmark, "description": description, "command": command(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git_commit(), "reference": reference, "machine": machine(), "source": "measured",
            "results": [], "ratios": [], "notes": list(notes),
        }
        if layout is not None:
            self.doc["layout"] = layout

    def add(self, case: str, side: str, metric: str, unit: str, samples: Sequence[float] | None = None,
            value: float | None = None, keep_samples: bool = True, **extra: Any) -> dict[str, Any]:
        """A row: the median of `samples` (with its spread), or a single `value` (a count, a computed figure)."""
        if (samples is None) == (value is None):
            raise ValueError("give samples or a value, not both")
        row: dict[str, Any] = {"case": case, "side": side, "metric": metric, "unit": unit}
        if samples is not None:
            row["stats"] = stats(samples)
            row["value"] = row["stats"]["median"]
            if keep_samples:
                row["samples"] = list(samples)
        else:
            row["value"] = value
        row.update(extra)
        self.doc["results"].append(row)
        return row

    def get(self, case: str, side: str, metric: str) -> dict[str, Any]:
        """The row of (`case`, `side`, `metric`)."""
        rows: list[dict[str, Any]] = self.doc["results"]
        for row in rows:
            if (row["case"], row["side"], row["metric"]) == (case, side, metric):
                return row
        raise KeyError((case, side, metric))

    def ratio(self, case: str, metric: str, side: str, over: str) -> float:
        """Record and return value(`side`) / value(`over`) for `case` and `metric`."""
        value = float(self.get(case, side, metric)["value"] / self.get(case, over, metric)["value"])
        self.doc["ratios"].append({"case": case, "metric": metric, "side": side, "over": over, "value": value})
        return value

    def write(self, path: Path | None) -> dict[str, Any]:
        """Record the load now and write the file (pretty JSON); with no path, only return the document."""
        self.doc["machine"]["load_after"] = load()
        errors = validate(self.doc)
        if errors:
            raise ValueError("results do not fit the schema: " + "; ".join(errors))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.doc, indent=1, ensure_ascii=False) + "\n")
            print(f"wrote {path}", file=sys.stderr)
        return self.doc


_REQUIRED = {"schema": int, "benchmark": str, "description": str, "command": str, "date": str,
             "machine": dict, "source": str, "results": list, "ratios": list}
_ROW = {"case": str, "side": str, "metric": str, "unit": str, "value": (int, float)}
_RATIO = {"case": str, "metric": str, "side": str, "over": str, "value": (int, float)}
_MACHINE = {"cpus": int, "python": str}


def _fields(item: Any, spec: dict[str, Any], where: str) -> list[str]:
    if not isinstance(item, dict):
        return [f"{where} is not an object"]
    return [f"{where}: {key!r} missing or not {getattr(kind, '__name__', kind)}" for key, kind in spec.items()
            if not isinstance(item.get(key), kind) or isinstance(item.get(key), bool)]


def validate(doc: Any) -> list[str]:
    """What is wrong with a results document (empty when it fits the schema above)."""
    errors = _fields(doc, _REQUIRED, "document")
    if errors:
        return errors
    if doc["schema"] != SCHEMA:
        errors.append(f"schema {doc['schema']}, expected {SCHEMA}")
    if doc["source"] != "measured" and not isinstance(doc.get("original"), dict):
        errors.append("transcribed results need 'original' (the date, commit and load their source gave)")
    if not doc["results"]:
        errors.append("no results")
    if doc["source"] == "measured":
        errors += _fields(doc["machine"], _MACHINE, "machine")
    row_errors = [e for i, row in enumerate(doc["results"]) for e in _fields(row, _ROW, f"results[{i}]")]
    errors += row_errors
    if not row_errors:  # a table has one cell per case, side and metric: a second row would hide the first
        seen: set[tuple[str, str, str]] = set()
        for row in doc["results"]:
            key = (row["case"], row["side"], row["metric"])
            if key in seen:
                errors.append(f"two results for case {key[0]!r}, side {key[1]!r}, metric {key[2]!r}")
            seen.add(key)
    errors += [e for i, row in enumerate(doc["ratios"]) for e in _fields(row, _RATIO, f"ratios[{i}]")]
    notes = doc.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(note, str) for note in notes):
        errors.append("notes must be a list of strings")
    layout = doc.get("layout", DEFAULT_LAYOUT)
    by = layout.get("rows") if isinstance(layout, dict) else None
    named = [*by, layout.get("columns")] if isinstance(by, list) else []
    if sorted(map(str, named)) != sorted(KEYS):
        errors.append("layout: 'rows' (a list) and 'columns' must name case, side and metric once each")
    return errors


def read(path: Path) -> dict[str, Any]:
    """A results file, checked against the schema (ValueError naming the file and what is wrong)."""
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    errors = validate(doc)
    if errors:
        raise ValueError(f"{path}: " + "; ".join(errors))
    return doc  # type: ignore[no-any-return]


def out_argument(parser: Any, name: str) -> None:
    """Add ``--out PATH`` to an argparse parser: where to write the results (none when not given)."""
    parser.add_argument("--out", type=Path, default=None,
                        help=f"write the results as JSON here (the docs read bench/results/{name}.json)")


def number(value: float) -> str:
    """A figure as the tables print it: about three significant digits (trailing zeros kept, so 0.500
    sits beside 0.536 in a column), thousands separated."""
    size = abs(value)
    if size >= 100 or isinstance(value, int):
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if size >= 1 else f"{value:#.3g}"


def times(ratio: float) -> str:
    """A ratio as the tables print it (``7.7x``)."""
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x" if ratio < 100 else f"{ratio:,.0f}x"


def _ordered(values: Iterator[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _name(row: dict[str, Any], key: str) -> str:
    if key == "metric" and row["unit"]:
        return f"{row['metric']} ({row['unit']})"
    return str(row[key])


def table(doc: dict[str, Any]) -> str:
    """The results as one Markdown table: by default a row per case and metric and a column per side
    (``layout`` may choose otherwise); a row key with a single value is left out of the labels. A cell
    holds the figure and, where a ratio was recorded for it, ``(side / over)``."""
    layout = doc.get("layout", DEFAULT_LAYOUT)
    results, column = doc["results"], layout["columns"]
    varying = [k for k in layout["rows"] if len({_name(r, k) for r in results}) > 1] or layout["rows"][:1]
    constant = [_name(results[0], k) for k in layout["rows"] if k not in varying]
    ratios = {(q["case"], q["side"], q["metric"]): q["value"] for q in doc["ratios"]}
    columns = _ordered(_name(r, column) for r in results)
    cells: dict[tuple[str, str], str] = {}
    for r in results:
        ratio = ratios.get((r["case"], r["side"], r["metric"]))
        label = ", ".join(_name(r, k) for k in varying)
        cells[(label, _name(r, column))] = number(r["value"]) + (f" ({times(ratio)})" if ratio is not None else "")
    labels = _ordered(label for label, _ in cells)
    lines = [f"| {', '.join(constant)} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(cells.get((label, c), "-") for c in columns) + " |" for label in labels]
    return "\n".join(lines)


def provenance(doc: dict[str, Any]) -> str:
    """One line under a table: where, when and on what the figures were taken, and how ratios read."""
    m = doc["machine"]
    overs = _ordered(q["over"] for q in doc["ratios"])
    named = " / ".join(f"“{o}”" for o in overs)
    ratio = f" In brackets: the figure divided by the {named} figure." if overs else ""
    if doc["source"] != "measured":
        o = doc["original"]
        source = doc["source"][:1].upper() + doc["source"][1:]
        return (f"{source} (written there {o.get('date', 'on a date not given')}"
                f"{' in commit ' + o['commit'] if o.get('commit') else ''}; {m.get('cpus', '?')} CPUs, "
                f"load average {o.get('load', 'not given')}); not re-run.{ratio}")
    ref = doc.get("reference") or {}
    against = f" against {ref['name']}" if ref.get("name") else ""
    loads = "/".join(str(m[k][0]) for k in ("load_before", "load_after") if m.get(k))
    return (f"Measured {doc['date'][:10]} on commit {doc.get('commit') or '?'}{against}: {m['cpus']} CPUs "
            f"shared with other jobs (load average {loads} before/after), Python {m['python']}; "
            f"`{doc['command']}`.{ratio}")

"""The docs' performance tables are the benchmarks' data: every ``<!-- results: NAME -->`` marker in
docs/ names results files that exist and fit the schema of ``bench/_harness.py``, and what the
docs render carries the files' own figures, so a page cannot drift from its data."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _load("docs_results_hook", ROOT / "docs" / "hooks" / "results.py")
harness = hook.harness
PAGES = sorted((ROOT / "docs").rglob("*.md"))  # the hook renders markers on every page, guides included
MARKED = [(page.relative_to(ROOT / "docs").as_posix(), name)
          for page in PAGES for name in hook.markers(page.read_text())]
RENDERED = sorted({(name, path) for _, name in MARKED for path in hook.files_for(name)})
"""Each results file a page renders, with the marker that renders it."""
FILES = sorted({path for _, path in RENDERED})


def _doc(rows: list[tuple[str, str, str, str, float]], **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": harness.SCHEMA, "benchmark": "t", "description": "d", "command": "python bench/t.py",
        "date": "2026-12-01T00:00:00+00:00", "commit": "abc1234", "reference": None,
        "machine": {"cpus": 2, "python": "3.11.7", "load_before": [1.0], "load_after": [1.5]},
        "source": "measured", "ratios": [],
        "results": [{"case": c, "side": s, "metric": m, "unit": u, "value": v} for c, s, m, u, v in rows]}
    doc.update(fields)
    return doc


def _cells(markdown: str) -> dict[tuple[str, str], str]:
    """A rendered table as {(row label, column): cell}."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    columns = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    out = {}
    for line in lines[2:]:
        label, *cells = (c.strip() for c in line.strip("|").split("|"))
        out.update({(label, column): cell for column, cell in zip(columns, cells, strict=True)})
    return out


def test_the_performance_page_renders_results() -> None:
    assert [name for page, name in MARKED if page == "performance.md"], "docs/performance.md has no results marker"


@pytest.mark.parametrize(("page", "name"), MARKED, ids=[f"{page}:{name}" for page, name in MARKED])
def test_every_marker_names_results_files_of_the_schema(page: str, name: str) -> None:
    paths = hook.files_for(name)
    assert paths, f"{page}: <!-- results: {name} --> has no bench/results/{name}.json"
    for path in paths:
        assert harness.validate(json.loads(path.read_text())) == [], path


@pytest.mark.parametrize(("name", "path"), RENDERED, ids=[p.name for _, p in RENDERED])
def test_every_figure_of_a_file_is_in_the_tables_its_marker_renders(name: str, path: Path) -> None:
    doc = harness.read(path)
    rendered = hook.render_markers(f"<!-- results: {name} -->")
    table = harness.table(doc)
    assert table in rendered
    cells = [cell for cell in _cells(table).values() if cell != "-"]
    # One cell per row, each holding its row's figure (none dropped, none hidden by another).
    assert sorted(cell.split(" (")[0] for cell in cells) == sorted(harness.number(r["value"]) for r in doc["results"])
    assert sorted(cell.split(" (")[1].rstrip(")") for cell in cells if " (" in cell) == \
        sorted(harness.times(q["value"]) for q in doc["ratios"])
    assert harness.provenance(doc) in rendered


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_a_changed_figure_changes_the_table(path: Path) -> None:
    doc = harness.read(path)
    changed = copy.deepcopy(doc)
    changed["results"][0]["value"] = 987654.0
    assert "987,654" in harness.table(changed)
    assert "987,654" not in harness.table(doc)


def test_every_results_file_that_declares_the_schema_fits_it() -> None:
    declared = [p for p in (ROOT / "bench" / "results").glob("*.json") if "schema" in json.loads(p.read_text())]
    assert declared
    for path in declared:
        assert harness.validate(json.loads(path.read_text())) == [], path


def test_transcribed_figures_say_where_and_when_they_were_taken() -> None:
    transcribed = [harness.read(p) for p in FILES if harness.read(p)["source"] != "measured"]
    for doc in transcribed:
        assert doc["source"].startswith("transcribed from "), doc["benchmark"]
        assert {"date", "commit", "load"} <= set(doc["original"]), doc["benchmark"]
        assert "not re-run" in harness.provenance(doc)


def test_a_marker_without_its_file_stops_the_build(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no missing\.json or missing-\*\.json"):
        hook.render_markers("text <!-- results: missing --> text", tmp_path)


def test_a_file_off_the_schema_is_named(tmp_path: Path) -> None:
    doc = _doc([("c", "s", "wall", "ms", 1.0)])
    del doc["command"]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"bad\.json: document: 'command' missing"):
        hook.render_markers("<!-- results: bad -->", tmp_path)


def test_a_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{"schema": 1,')
    with pytest.raises(ValueError, match=r"broken\.json: not JSON"):
        hook.render_markers("<!-- results: broken -->", tmp_path)


def test_a_file_s_notes_and_provenance_follow_its_table(tmp_path: Path) -> None:
    doc = _doc([("c", "s", "wall", "ms", 1.25)], notes=["Measured with the fans on."])
    (tmp_path / "n.json").write_text(json.dumps(doc))
    rendered = hook.render_markers("<!-- results: n -->", tmp_path)
    assert rendered.index("| c | 1.25 |") < rendered.index("Measured with the fans on.")
    assert rendered.index("Measured with the fans on.") < rendered.index("load average 1.0/1.5 before/after")


def test_a_marker_renders_its_file_then_the_files_named_after_it(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps(_doc([("c", "s", "wall", "ms", 1.25)])))
    (tmp_path / "x-idle.json").write_text(json.dumps(_doc([("c", "s", "wall", "ms", 2.5)])))
    (tmp_path / "xy.json").write_text(json.dumps(_doc([("c", "s", "wall", "ms", 7.5)])))
    rendered = hook.render_markers("before\n<!-- results: x -->\nafter", tmp_path)
    assert rendered.index("1.25") < rendered.index("2.50")
    assert "7.50" not in rendered
    assert rendered.startswith("before\n") and rendered.endswith("\nafter")


@pytest.mark.parametrize(("change", "error"), [
    (lambda d: d["results"][0].update(value=True), "'value' missing or not"),
    (lambda d: d["results"].clear(), "no results"),
    (lambda d: d.update(source="transcribed from a paper"), "need 'original'"),
    (lambda d: d.update(layout={"rows": ["case"], "columns": "side"}), "layout"),
    (lambda d: d["ratios"].append({"case": "c", "side": "s"}), "ratios[0]"),
    (lambda d: d.update(schema=2), "schema 2"),
    (lambda d: d.update(notes="one note"), "notes"),
    (lambda d: d.update(layout={"rows": ["case", "metric"]}), "layout"),
    (lambda d: d["results"].append(dict(d["results"][0], value=2.0)), "two results for case 'c'"),
    (lambda d: d["machine"].pop("cpus"), "machine: 'cpus'"),
])
def test_the_schema_refuses_what_the_tables_cannot_show(change: Any, error: str) -> None:
    doc = _doc([("c", "s", "wall", "ms", 1.0)])
    assert harness.validate(doc) == []
    change(doc)
    assert any(error in e for e in harness.validate(doc))


NAMES = st.text(alphabet="abcdefgh ", min_size=1, max_size=8).map(str.strip).filter(bool)


@given(cases=st.lists(NAMES, min_size=1, max_size=4, unique=True),
       sides=st.lists(NAMES, min_size=2, max_size=4, unique=True),
       values=st.lists(st.floats(min_value=1e-4, max_value=1e7), min_size=16, max_size=16))
def test_each_cell_holds_its_figure_and_its_ratio(cases: list[str], sides: list[str], values: list[float]) -> None:
    rows = [(c, s, "wall", "ms", values[4 * i + j]) for i, c in enumerate(cases) for j, s in enumerate(sides)]
    doc = _doc(rows)
    doc["ratios"] = [{"case": c, "metric": "wall", "side": sides[1], "over": sides[0],
                      "value": values[4 * i + 1] / values[4 * i]} for i, c in enumerate(cases)]
    assert harness.validate(doc) == []
    cells = _cells(harness.table(doc))
    for i, case in enumerate(cases):
        assert cells[(case, sides[0])] == harness.number(values[4 * i])
        ratio = harness.times(values[4 * i + 1] / values[4 * i])
        assert cells[(case, sides[1])] == f"{harness.number(values[4 * i + 1])} ({ratio})"


@pytest.mark.parametrize(("value", "shown"), [(1234567.0, "1,234,567"), (12, "12"), (42.31, "42.3"), (4.5, "4.50"),
                                             (0.5, "0.500"), (0.0866, "0.0866"), (0.9996, "1.00")])
def test_figures_keep_three_significant_digits(value: float, shown: str) -> None:
    assert harness.number(value) == shown


def test_a_layout_puts_the_metrics_in_the_columns() -> None:
    doc = _doc([("N=1", "cp", "first", "ms", 135), ("N=1", "cp", "later", "ms", 4.5),
                ("N=2", "cp", "first", "ms", 1500), ("N=2", "cp", "later", "ms", 2.25)],
               layout={"rows": ["case", "side"], "columns": "metric"})
    assert _cells(harness.table(doc)) == {("N=1", "first (ms)"): "135", ("N=1", "later (ms)"): "4.50",
                                          ("N=2", "first (ms)"): "1,500", ("N=2", "later (ms)"): "2.25"}

"""MkDocs hook: a page's ``<!-- results: NAME -->`` becomes the tables of ``bench/results/NAME.json``.

A marker names a results file by its stem: ``NAME.json`` and every ``NAME-*.json`` beside it are
rendered, each as a Markdown table followed by its notes and a line saying where, when and against
what its figures were taken (``bench/_harness.py`` defines the schema and both renderings, so the tables a benchmark
prints are the ones the docs show). A marker whose files are missing, or a file that does not fit
the schema, stops the build with the file's name: the page cannot drift from the data.

Registered in ``mkdocs.yml``::

    hooks:
      - docs/hooks/results.py

``render_markers`` is the plain function behind the hook (tests call it).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
MARKER = re.compile(r"<!--\s*results:\s*([A-Za-z0-9_.-]+)\s*-->")


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("contextpipe_bench_harness", ROOT / "bench" / "_harness.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _harness()


def files_for(name: str, results: Path = RESULTS) -> list[Path]:
    """Return the files a marker naming `name` stands for: ``NAME.json``, then each ``NAME-*.json``."""
    exact = results / f"{name}.json"
    return [p for p in [exact] if p.exists()] + sorted(results.glob(f"{name}-*.json"))


def render(name: str, results: Path = RESULTS) -> str:
    """Render one marker: each of its files' table and provenance line."""
    paths = files_for(name, results)
    if not paths:
        where = results.relative_to(ROOT) if results.is_relative_to(ROOT) else results
        raise ValueError(f"<!-- results: {name} -->: no {name}.json or {name}-*.json in {where}; "
                         f"run the benchmark with --out {where}/{name}.json (bench/README.md) or fix the marker")
    parts = []
    for path in paths:
        doc = harness.read(path)
        notes = "".join(f"{note}\n\n" for note in doc.get("notes", []))
        parts.append(f"{harness.table(doc)}\n\n{notes}<small>{harness.provenance(doc)} "
                     f"(`bench/results/{path.name}`)</small>")
    return "\n\n".join(parts)


def markers(markdown: str) -> list[str]:
    """Return the names the markers of a page refer to, in order."""
    return MARKER.findall(markdown)


def render_markers(markdown: str, results: Path = RESULTS) -> str:
    """Replace every results marker of `markdown` by its tables."""
    return MARKER.sub(lambda m: render(m.group(1), results), markdown)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: render the markers of each page before it is converted to HTML."""
    from mkdocs.exceptions import PluginError

    try:
        return render_markers(markdown)
    except ValueError as exc:  # the build stops with this message alone
        raise PluginError(f"docs/{page.file.src_path}: {exc}") from exc

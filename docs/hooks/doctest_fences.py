"""A griffe extension for the API reference: docstring doctests (``>>>`` lines) render as code.

contextpipe's docstrings carry runnable doctests inline (pytest runs them with ``--doctest-modules``).
Markdown would render them as prose (``['haiku']`` even reads as a link), so each run of doctest
lines, with the output lines that follow it, is wrapped in a ``pycon`` fence before mkdocstrings
renders the docstring.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    """Return `text` with each block of ``>>>`` lines and their output inside a ``pycon`` fence."""
    out: list[str] = []
    inside = False
    indent = ""
    fenced = False
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
        if not fenced and not inside and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            inside = True
        elif inside and not stripped:
            out.append(f"{indent}```")
            inside = False
        out.append(line)
    if inside:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Wrap docstring doctests in code fences."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the object's docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)

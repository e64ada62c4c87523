"""SQL text for `SQLiteVectorStore`: scripts split into statements, names quoted, metadata filters as clauses."""

from __future__ import annotations

import sqlite3
from typing import Any

from .base import Where


def statements(script: str) -> list[str]:
    """Split a SQL script into statements (triggers hold ``;`` inside them)."""
    out, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    if current.strip():
        out.append(current.strip())
    return out


def sql_text(value: str) -> str:
    """`value` as an SQL expression: quoted pieces, with ``char(0)`` for NUL (which no SQL literal may hold).

    Unlike a blob cast to text, it means the same in a UTF-8 or a UTF-16 database.
    """
    return " || char(0) || ".join("'" + piece.replace("'", "''") + "'" for piece in value.split("\x00"))


def json_where(where: Where | None, column: str = "metadata") -> tuple[list[str], list[Any]]:
    """Return `where` as SQL clauses on the JSON `column` (to join with AND) and their parameters."""
    clauses: list[str] = []
    params: list[Any] = []
    for key, value in (where or {}).items():
        # None stands for no value: the key missing or null (json_extract gives NULL for both).
        if isinstance(value, list | tuple | set | frozenset):
            values = [v for v in value if v is not None]
            clause = f"json_extract({column}, ?) IN ({','.join('?' * len(values))})"
            params += [f"$.{key}", *values]
            if len(values) < len(value):
                clause = f"({clause} OR json_extract({column}, ?) IS NULL)"
                params.append(f"$.{key}")
            clauses.append(clause)
        elif value is None:
            clauses.append(f"json_extract({column}, ?) IS NULL")
            params.append(f"$.{key}")
        else:
            clauses.append(f"json_extract({column}, ?) = ?")
            params += [f"$.{key}", value]
    return clauses, params

"""`SQLiteVectorStore`'s keyword search: one FTS5 table per collection, kept in step by triggers, ranked by BM25.

Each collection has its own FTS5 table (``cp_keywords_<number>``, numbered in ``cp_vector_keywords``),
so BM25's word statistics (how many records hold a word, how long they are) are the collection's
own, whatever else the file holds; three triggers keep it in step with the collection's rows inside
the same transaction as the row.

A search reads the ranking from the FTS5 table. `search_rows` then reads the hits' rows from SQLite
(the plain version); `search_held` takes them, and answers a filter, from the collection's index
held in memory (`CollectionIndex`) when the store has it. A property test holds the two to the same
hits.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ._hnsw import CollectionIndex
from ._sql import json_where, sql_text, statements
from .base import SearchHit, Where, matches

_KEYWORDS = """
CREATE VIRTUAL TABLE {t} USING fts5(
    keywords, content='cp_vectors', content_rowid='key', tokenize='porter unicode61 remove_diacritics 2');
CREATE TRIGGER {t}_insert AFTER INSERT ON cp_vectors WHEN new.collection = {c} BEGIN
    INSERT INTO {t} (rowid, keywords) VALUES (new.key, new.keywords);
END;
CREATE TRIGGER {t}_delete AFTER DELETE ON cp_vectors WHEN old.collection = {c} BEGIN
    INSERT INTO {t} ({t}, rowid, keywords) VALUES ('delete', old.key, old.keywords);
END;
CREATE TRIGGER {t}_update AFTER UPDATE ON cp_vectors WHEN old.collection = {c} OR new.collection = {c} BEGIN
    INSERT INTO {t} ({t}, rowid, keywords) SELECT 'delete', old.key, old.keywords WHERE old.collection = {c};
    INSERT INTO {t} (rowid, keywords) SELECT new.key, new.keywords WHERE new.collection = {c};
END
"""

_RANKED = "SELECT rowid, -bm25({t}) AS score FROM {t} WHERE {t} MATCH ? ORDER BY score DESC LIMIT ?"
_ROWS_MAX = 12_800  # `search_rows` asks the ranking for at most this many before SQLite filters all the matches
_HELD_MAX = 6_400  # the same for `search_held`


def fts_query(terms: list[str]) -> str:
    """Return an FTS5 query for records holding any of `terms` (each quoted)."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


def first_limit(k: int, where: Where | None) -> int:
    """How many of the ranking a search reads first: `k`, or (with a filter) the best few hundred."""
    return k if not where else max(2 * k, 100)


class KeywordTables:
    """The names of a file's per-collection FTS5 tables, remembered once committed (numbers never change)."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def table(self, conn: sqlite3.Connection, collection: str, *, create: bool = False) -> str | None:
        """Return the name of `collection`'s FTS5 table (`create`: in the open write transaction, if it has none).

        Without `create`, a collection with rows but no table (rows written by other means than this
        store) gets one too, in a transaction of its own. A name is remembered only once its table is
        committed (a transaction that made it may still roll back).
        """
        table = self._names.get(collection) or _keyword_table(conn, collection)
        if table is None:
            if create:  # (remembered when the next call finds it committed)
                return build_keywords(conn, collection)
            if not conn.execute("SELECT 1 FROM cp_vectors WHERE collection = ? LIMIT 1", (collection,)).fetchone():
                return None
            conn.execute("BEGIN IMMEDIATE")
            try:  # (another connection may have made it meanwhile)
                table = _keyword_table(conn, collection) or build_keywords(conn, collection)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        self._names[collection] = table
        return table


def _keyword_table(conn: sqlite3.Connection, collection: str) -> str | None:
    """Return the name of `collection`'s FTS5 table as the file records it (``None``: it has none)."""
    row = conn.execute("SELECT number FROM cp_vector_keywords WHERE collection = ?", (collection,)).fetchone()
    return None if row is None else f"cp_keywords_{int(row[0])}"


def build_keywords(conn: sqlite3.Connection, collection: str) -> str:
    """(Re)build `collection`'s FTS5 table and its triggers from its rows, in the open write transaction."""
    table = _keyword_table(conn, collection)
    if table is None:
        number = int(conn.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM cp_vector_keywords").fetchone()[0])
        conn.execute("INSERT INTO cp_vector_keywords (collection, number) VALUES (?, ?)", (collection, number))
        table = f"cp_keywords_{number}"
    for trigger in ("insert", "delete", "update"):
        conn.execute(f"DROP TRIGGER IF EXISTS {table}_{trigger}")
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    for statement in statements(_KEYWORDS.format(t=table, c=sql_text(collection))):
        conn.execute(statement)
    conn.execute(f"INSERT INTO {table} (rowid, keywords) SELECT key, keywords FROM cp_vectors WHERE collection = ?",
                 (collection,))
    return table


def search_rows(conn: sqlite3.Connection, table: str, collection: str, query: str, k: int,
                where: Where | None) -> list[SearchHit]:
    """Return the best `k` matches of `query` among `collection`'s records matching `where`, from the rows.

    The collection's FTS table ranks on its own (fast); with a filter, the best few hundred are then
    checked against it, asking for more while too few pass, and SQLite filters all the matches when
    the filter keeps few of them.
    """
    limit = first_limit(k, where)
    while True:
        ranked = conn.execute(_RANKED.format(t=table), (query, limit)).fetchall()
        rows = {r[0]: r[1:] for r in conn.execute(
            f"SELECT key, id, text, metadata FROM cp_vectors WHERE collection = ? AND key IN "
            f"({','.join('?' * len(ranked))})", [collection, *(r[0] for r in ranked)])} if ranked else {}
        hits = []
        for key, score in ranked:
            row = rows.get(key)
            if row is None:
                continue
            meta = json.loads(row[2])
            if where and not matches(meta, where):
                continue
            hits.append(SearchHit(row[0], float(score), row[1], meta))
            if len(hits) == k:
                return hits
        if len(ranked) < limit:
            return hits
        if limit >= _ROWS_MAX:
            break
        limit *= 4
    # A filter that keeps few of the matches: let SQLite filter them all.
    sql_where, params = json_where(where, "v.metadata")
    clause = " AND ".join([f"{table} MATCH ?", *sql_where])
    found = conn.execute(
        f"SELECT v.id, v.text, v.metadata, -bm25({table}) AS score FROM {table} "
        f"JOIN cp_vectors v ON v.key = {table}.rowid WHERE {clause} ORDER BY score DESC LIMIT ?",
        [query, *params, k]).fetchall()
    return [SearchHit(r[0], float(r[3]), r[1], json.loads(r[2])) for r in found]


def search_held(conn: sqlite3.Connection, c: CollectionIndex, table: str, query: str, k: int,
                where: Where | None) -> list[SearchHit]:
    """Return what `search_rows` returns, for a collection whose index `c` is held: filtered with its postings.

    The ids, texts and metadata are `c`'s (no rows read); a filter is answered from its postings.
    """
    subset = c.keys_matching(where) if where else None
    if subset is not None and not subset:
        return []
    pool: set[int] | dict[int, Any] = c.records if subset is None else subset  # (postings hold known keys)
    limit = first_limit(k, where)
    while True:
        ranked = conn.execute(_RANKED.format(t=table), (query, limit)).fetchall()
        found = [(key, score) for key, score in ranked if key in pool][:k]
        if len(found) == k or len(ranked) < limit:
            break
        if limit >= _HELD_MAX and subset is not None:  # a filter that keeps few of the matches
            found = _ranked_within(conn, c, table, query, k, subset)
            break
        limit *= 4
    records = c.records
    return [SearchHit(r[0], float(score), r[1], r[2]) for key, score in found for r in (records[key],)]


def _ranked_within(conn: sqlite3.Connection, c: CollectionIndex, table: str, query: str, k: int,
                   subset: set[int]) -> list[tuple[int, float]]:
    """Return the best `k` keyword matches among the records `subset` (SQLite filters them all)."""
    ranked = conn.execute(
        f"SELECT rowid, -bm25({table}) AS score FROM {table} WHERE {table} MATCH ? "
        "AND rowid IN (SELECT value FROM json_each(?)) ORDER BY score DESC LIMIT ?",
        (query, json.dumps(sorted(subset)), k)).fetchall()
    return [(key, score) for key, score in ranked if key in c.records]

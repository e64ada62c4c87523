"""Artifacts: bytes kept beside a session's log (a tool result too big to send whole), read back by range.

An artifact belongs to one session: it is named by the session's key and an id the writer chooses
(`contextpipe.providers.Artifacts` uses the tool call's id and a digest of the bytes, so a step
resumed after a crash that produces the same result stores nothing twice). Writing is idempotent by
id: the first bytes written under an id stay, a second write returns what is there. A write creates
the session's record when there is none and counts as its activity for its TTL; it is fenced by the
session's lease as a checkpoint is (a run that lost its lease gets `LeaseLost` and writes nothing, so
it cannot bring an erased session back holding an artifact). Deleting a session, or its
expiry, deletes its artifacts (`Erased.artifacts` counts them).

The tables' classes are in `_artifacts_sql` and `_artifacts_redis`; the memory store keeps
`contextpipe.stores.memory.MemoryArtifacts` in each session's entry.
"""

from __future__ import annotations

from typing import Final, Protocol

from ..errors import UsageError
from ..session import SessionKey
from ._records import Artifact, Lease

__all__ = ["MAX_ARTIFACT_BYTES", "SQLITE_ARTIFACTS", "SQLITE_FRESH", "Artifact", "ArtifactTable", "check_artifact",
           "check_artifact_id", "check_range", "postgres_migration"]


SQLITE_ARTIFACTS: Final = """
CREATE TABLE IF NOT EXISTS cp_artifacts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a blob read by rowid finds no other tenant's bytes
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    artifact_id TEXT NOT NULL,
    media_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS cp_artifacts_id ON cp_artifacts (tenant, session_id, artifact_id);
"""
"""The SQLite artifact table (created, when missing, whenever a store opens its file for writing)."""

SQLITE_FRESH: Final = """
CREATE TRIGGER IF NOT EXISTS cp_artifacts_fresh AFTER INSERT ON cp_sessions BEGIN
    DELETE FROM cp_artifacts WHERE tenant = NEW.tenant AND session_id = NEW.session_id;
END
"""
"""A session row made afresh starts without artifacts (one statement: run whole, not split at ``;``).

An earlier release's erase deleted the session's row but not its artifacts (it knew none); without
this, a new session of that id, of any user, would read them. The trigger lives in the file, so it
also fires for rows an earlier release's writer makes.
"""


class ArtifactTable(Protocol):
    """What each backend does for artifacts; every method is on a validated key and checked arguments."""

    async def put(self, key: SessionKey, artifact_id: str, data: bytes, media_type: str,
                  lease: Lease | None) -> Artifact:
        """Store `data` under `artifact_id` unless an artifact has that id; return the one stored (lease-fenced)."""

    async def copy(self, source: SessionKey, target: SessionKey, lease: Lease | None) -> int:
        """Copy every artifact of `source` into `target` (ids kept, lease-fenced on `target`); return how many."""

    async def info(self, key: SessionKey, artifact_id: str) -> Artifact | None:
        """Return the artifact's record, None when the session has none of that id."""

    async def read(self, key: SessionKey, artifact_id: str, offset: int, length: int) -> bytes | None:
        """Return up to `length` bytes from `offset` (fewer at the end), None when there is no such artifact."""


MAX_ARTIFACT_BYTES: Final = 512 * 1024 * 1024
"""The largest artifact a store keeps (512 MiB, within every backend's own limit); a bigger one is a `UsageError`."""


def artifact_id_problem(artifact_id: str) -> str | None:
    """Say why the string `artifact_id` cannot name an artifact (None: it can)."""
    if not artifact_id or len(artifact_id) > 200 or "\x00" in artifact_id:
        return "1 to 200 characters, no NUL"
    try:
        artifact_id.encode("utf-8")
    except UnicodeEncodeError:
        return "UTF-8 text (no lone surrogates)"
    return None


def check_artifact_id(artifact_id: object, *, reading: bool = False) -> bool:
    """Check an id: raise `UsageError` for one that is not a string or, writing, names no possible artifact.

    Reading (`reading`), return False for a string no artifact can have (the caller answers "none"),
    so a handle a model made up reads as missing rather than failing in the store.
    """
    if not isinstance(artifact_id, str):
        raise UsageError(f"an artifact id is a string, got {type(artifact_id).__name__}")
    problem = artifact_id_problem(artifact_id)
    if problem is not None and not reading:
        raise UsageError(f"an artifact id is {problem}, got {artifact_id!r:.80}")
    return problem is None


def check_artifact(artifact_id: object, data: object, media_type: object) -> None:
    """Raise `UsageError` unless the arguments of a write are an id, bytes and a media type."""
    check_artifact_id(artifact_id)
    if not isinstance(data, bytes):
        raise UsageError(f"an artifact holds bytes, got {type(data).__name__}; encode text first "
                         "(text.encode('utf-8'))")
    if len(data) > MAX_ARTIFACT_BYTES:
        raise UsageError(f"an artifact holds at most {MAX_ARTIFACT_BYTES:,} bytes (512 MiB), got {len(data):,}; "
                         "store it elsewhere and keep a reference")
    if (not isinstance(media_type, str) or "/" not in media_type or len(media_type) > 200
            or not all(" " <= c <= "~" for c in media_type)):
        raise UsageError("an artifact needs a media type such as 'text/plain; charset=utf-8' (printable ASCII, "
                         f"at most 200 characters), got {media_type!r:.80}")


def check_range(offset: object, length: object) -> None:
    """Raise `UsageError` unless `offset` and `length` are integers, `offset` >= 0 and `length` >= 1."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise UsageError(f"an artifact's offset is an integer >= 0 (a byte position), got {offset!r:.40}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise UsageError(f"an artifact read's length is an integer >= 1 (bytes), got {length!r:.40}")


def postgres_migration(p: str) -> list[str]:
    """Return the schema step that adds the artifact table (tables prefixed `p`).

    The bodies are stored uncompressed out of line (``STORAGE EXTERNAL``), so reading a range reads
    only the pages it covers instead of the whole value.
    """
    return [
        f"""CREATE TABLE {p}artifacts (
            tenant TEXT NOT NULL, session_id TEXT NOT NULL, artifact_id TEXT NOT NULL, media_type TEXT NOT NULL,
            size BIGINT NOT NULL, body BYTEA NOT NULL, PRIMARY KEY (tenant, session_id, artifact_id))""",
        f"ALTER TABLE {p}artifacts ALTER COLUMN body SET STORAGE EXTERNAL",
        # A session row made afresh starts without artifacts (`SQLITE_FRESH`; the trigger also fires for rows an
        # earlier release, whose erase left artifacts behind, makes).
        f"""CREATE OR REPLACE FUNCTION {p}artifacts_fresh() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            DELETE FROM {p}artifacts WHERE tenant = NEW.tenant AND session_id = NEW.session_id; RETURN NULL;
            END $$""",
        f"DROP TRIGGER IF EXISTS {p.replace('.', '_')}artifacts_fresh ON {p}sessions",
        f"CREATE TRIGGER {p.replace('.', '_')}artifacts_fresh AFTER INSERT ON {p}sessions FOR EACH ROW "
        f"EXECUTE FUNCTION {p}artifacts_fresh()",
    ]

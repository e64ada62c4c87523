"""The records a `SessionStore` hands out: leases, pages of the log, checkpoints, listings, erasures."""

from __future__ import annotations

from dataclasses import dataclass

from ..messages import Message
from ..session import SessionKey

__all__ = ["Artifact", "Checkpoint", "Erased", "Lease", "MessagePage", "SessionInfo", "SessionListing"]


@dataclass(frozen=True, slots=True)
class Lease:
    """The right to run on one session until `expires_at`; `token` fences writes."""

    tenant: str
    """Tenant of the leased session."""
    session_id: str
    """Id of the leased session."""
    owner: str
    """Who holds the lease (a random id per run)."""
    token: int
    """Fencing token: grows with every acquisition; writes carrying an older token are refused."""
    expires_at: float
    """Time (seconds since the epoch, on the store's clock) after which another run may take the lease over."""
    ttl: float
    """How long the lease lasts after each acquisition or renewal, in seconds."""

    @property
    def key(self) -> SessionKey:
        """The leased session's key."""
        return SessionKey(self.tenant, self.session_id)

    def renewed(self, expires_at: float) -> Lease:
        """Return the same lease, now expiring at `expires_at`."""
        return Lease(self.tenant, self.session_id, self.owner, self.token, expires_at, self.ttl)


@dataclass(frozen=True, slots=True)
class MessagePage:
    """A contiguous slice of a session's log, oldest first."""

    messages: list[Message]
    """The messages, in sequence order."""
    first_seq: int
    """Sequence of ``messages[0]`` (when empty: one past the end of the requested range)."""
    has_more: bool
    """True when older messages exist before this page (load again with ``before=first_seq``)."""

    @property
    def last_seq(self) -> int:
        """Sequence of the last message of the page (``first_seq - 1`` when empty)."""
        return self.first_seq + len(self.messages) - 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A summary standing in for the log up to and including sequence `seq`."""

    seq: int
    """Last sequence the summary covers."""
    summary: Message
    """The summary, sent to the model in place of the messages it covers."""
    created_at: float
    """When the checkpoint was written."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as listed: identity, version, sizes and times."""

    tenant: str
    session_id: str
    version: int
    message_count: int
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class SessionListing:
    """One page of `SessionStore.list_sessions`, most recently updated first."""

    sessions: list[SessionInfo]
    next_cursor: str | None
    """Pass to the next call to continue; None on the last page."""


@dataclass(frozen=True, slots=True)
class Erased:
    """What deleting one session removed from a store (`SessionStore.erase_session`)."""

    messages: int
    """Entries of its log."""
    summaries: int
    """Summary checkpoints."""
    traces: int
    """Stored prompt traces."""
    artifacts: int = 0
    """Artifacts kept beside its log (`contextpipe.artifacts`)."""


@dataclass(frozen=True, slots=True)
class Artifact:
    """What a store knows of one artifact without reading it."""

    id: str
    """The artifact's id in its session (the handle a model reads it by)."""
    media_type: str
    """Its media type (``text/plain; charset=utf-8`` for a spilled tool result)."""
    size: int
    """Its length in bytes."""

"""The session state of `FactMemory` (a pydantic model, imported when a FactMemory is made)."""

from __future__ import annotations

import hashlib
from typing import Any

import pydantic


class _Turn(pydantic.BaseModel):
    """A turn waiting for its facts to be extracted (or for its extraction to be seen to have finished)."""

    id: str
    text: str
    """The turn as the extraction model is shown it ("user: ...", "assistant: ...")."""
    at: float | None = None
    """When it was taken (the provider's clock); None for a turn kept by an older version."""
    sources: list[str] = []
    """The ids of its messages."""
    batch: str | None = None
    """The extraction it was last sent in: its facts' records name it once it has written them."""


class _Pending(pydantic.BaseModel):
    turns: list[_Turn] = []

    @pydantic.field_validator("turns", mode="before")
    @classmethod
    def _older(cls, turns: Any) -> Any:
        """Read a turn kept as plain text (before turns had ids) as a turn of unknown time and messages."""
        if not isinstance(turns, list):
            return turns
        return [{"id": "turn_" + hashlib.sha256(t.encode()).hexdigest()[:16], "text": t} if isinstance(t, str) else t
                for t in turns]

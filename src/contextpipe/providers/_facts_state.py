"""The session state of `FactMemory` (a pydantic model, imported when a FactMemory is made)."""

from __future__ import annotations

import pydantic


class _Pending(pydantic.BaseModel):
    turns: list[str] = []

"""`CompactionDecision`, the record of one change compaction made, apart from `compaction` itself.

Public as `contextpipe.compaction.CompactionDecision`. `trace` names it in `PromptTrace`'s fields, so
it must be importable at run time (``typing.get_type_hints(PromptTrace)`` resolves it) without
loading the strategies: an agent that compacts nothing never imports `compaction`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CompactionDecision"]


@dataclass(frozen=True, slots=True)
class CompactionDecision:
    """One thing compaction did to the view, for the trace."""

    strategy: str
    """The strategy that decided."""
    action: Literal["dropped", "summarised", "cleared", "over_budget"]
    """What happened to the messages."""
    message_ids: tuple[str, ...]
    """The messages concerned."""
    reason: str
    """Why, in words."""
    tokens_before: int
    """Request tokens before this decision."""
    tokens_after: int
    """Request tokens after it."""

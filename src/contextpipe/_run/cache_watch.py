"""The cache-bust warning: when a call throws away most of a cached prompt prefix, say what broke it.

Only a run whose model reports cache use pays for it: the check runs on a call when it or the
call before reported cache tokens, and the prefix fingerprint the next run compares with is kept
in the session's state (saved with it anyway, no store call added) only then. A run whose model
reports no cache use does one attribute test per call. ``trace.cache`` stays available on every
call, computed when read.
"""

from __future__ import annotations

import logging

from .._prompt_cache import PROMPT_CACHE_KEY, Prefix, fold_history
from ..models.base import Usage
from ..pipeline import RunContext
from ..trace import ContextChange, PromptTrace

__all__ = ["previous_prefix", "watch_cache"]

logger = logging.getLogger("contextpipe.cache")


def _reports_cache(usage: Usage | None) -> bool:
    return usage is not None and bool(usage.cache_read_tokens or usage.cache_write_tokens)


def previous_prefix(ctx: RunContext) -> PromptTrace | Prefix | None:
    """Return what the next call compares with: the run's previous call, or the session's previous run's last call."""
    if ctx.journal.traces:
        return ctx.journal.traces[-1]
    session = ctx.session
    if session is None or PROMPT_CACHE_KEY not in session.state:
        return None
    return Prefix.from_state(session.state[PROMPT_CACHE_KEY])


def watch_cache(ctx: RunContext, trace: PromptTrace) -> None:
    """Warn (trace change, log) when `trace`'s call lost most of the cached prefix; keep its fingerprint."""
    prev = trace._previous
    caching = _reports_cache(trace.usage) or isinstance(prev, Prefix) or (
        isinstance(prev, PromptTrace) and _reports_cache(prev.usage))
    if not caching:
        return
    check = trace.cache
    warning = check.warning(trace.step) if check is not None else None
    if warning is not None:
        trace.changes = (*trace.changes, ContextChange("prompt-cache", "cache_collapsed", (warning,)))
        logger.warning("%s", warning)
    if ctx.session is not None:
        prefix = trace.cache_prefix()
        kinds = [(m.message_id, m.source_kind, m.tokens) for m in trace.messages]
        kept = Prefix(prefix.tools, prefix.instructions, fold_history(kinds), prefix.cached_tokens)
        ctx.session.state[PROMPT_CACHE_KEY] = kept.to_state()

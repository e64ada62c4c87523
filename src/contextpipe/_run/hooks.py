"""Calling the context providers' hooks: `before_input` first, `before_run` in order, `after_run` always and in reverse.

The order is the agent's providers, then the run's own, save that an `AfterProviders` (a
`contextpipe.budget.ContextBudget`) comes after all of them, wherever it was given: it works on
what every other provider of the run contributed, and is told which providers those are.

`before_input` is for a run's own provider that decides what the run's input is against the
session's log, and may change the log first, under the run's lease (`BeforeInput`; the AG-UI route's
regenerate and edit, `serve._agui_rewind`). Each of the other hooks runs inside its own span (when
telemetry is on) and its time is written to the run's `RunJournal`, which the traces read.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from ..telemetry import Spans, hook_span
from ..trace import ProviderTiming

if TYPE_CHECKING:
    from ..messages import Message
    from ..pipeline import RunContext, RunOutcome
    from ..providers.base import ContextProvider
    from .writer import StepWriter

__all__ = ["AfterProviders", "BeforeInput", "in_order", "run_after", "run_before", "run_before_input"]


class BeforeInput(ABC):
    """A run's own provider (``Agent.run(providers=)``) that settles the run's input under the run's lease.

    Its `before_input` is called once the run holds its session's lease and before anything else:
    before the input is looked up as a retry (`_run.replay`) or stored. Whatever it writes is fenced
    by the run's own lease, so no other run or rewind comes between it and the run.
    """

    @abstractmethod
    async def before_input(self, writer: StepWriter, input: list[Message]) -> list[Message]:
        """Return the run's input (`input`, or another), given the run's `writer` (its store, session and lease).

        Writing to the session's state or log, it saves with ``writer.lease`` and brings the run's
        session up to date after (``writer.refresh()``).
        """


class AfterProviders(ABC):
    """A provider whose turn comes after every other provider's `before_run`, the agent's and the run's own."""

    @abstractmethod
    async def after_providers(self, ctx: RunContext, providers: Sequence[ContextProvider]) -> None:
        """Contribute in place of `before_run`, once the run's other `providers` (in their order) contributed."""


def in_order(providers: Sequence[ContextProvider]) -> list[ContextProvider]:
    """Return `providers` in the order their hooks run: each `AfterProviders` moved after the others."""
    return [*(p for p in providers if not isinstance(p, AfterProviders)),
            *(p for p in providers if isinstance(p, AfterProviders))]


async def run_before_input(providers: Sequence[ContextProvider], writer: StepWriter,
                           input: list[Message]) -> list[Message]:
    """Return the run's input as each `BeforeInput` of `providers` settles it, in order (no session: as given)."""
    if writer.session is None:
        return input
    for provider in providers:
        if isinstance(provider, BeforeInput):
            input = await writer.guard(provider.before_input(writer, input))
    return input


Guard = Callable[[Awaitable[None]], Awaitable[None]]
"""Awaits a hook, stopping it if the run must stop (the step writer's `guard`: a lost lease)."""


async def _unguarded(hook: Awaitable[None]) -> None:
    await hook


async def run_before(providers: Sequence[ContextProvider], ctx: RunContext, spans: Spans,
                     guard: Guard = _unguarded) -> None:
    """Call `before_run` on each provider in order (`in_order`), each through `guard`.

    A provider that raises stops the sequence (the run fails); ``ctx.journal.started`` counts it,
    so it still gets its `after_run`.
    """
    journal = ctx.journal
    traced = spans.tracer is not None
    providers = in_order(providers)
    others = [p for p in providers if not isinstance(p, AfterProviders)]
    for provider in providers:
        journal.started += 1
        span = hook_span(spans, provider.source_id, provider.kind, "before_run") if traced else None
        t0 = time.perf_counter()
        error: BaseException | None = None
        try:
            with ctx.contributing(provider.source_id):
                await guard(provider.after_providers(ctx, others) if isinstance(provider, AfterProviders)
                            else provider.before_run(ctx))
        except BaseException as exc:
            error = exc
            raise
        finally:
            journal.timings.append(ProviderTiming(provider.source_id, "before_run", time.perf_counter() - t0))
            if span is not None:
                Spans.end(span, error)


async def run_after(
    providers: Sequence[ContextProvider], ctx: RunContext, outcome: RunOutcome, spans: Spans
) -> list[tuple[str, BaseException]]:
    """Call `after_run` on the started providers in reverse order; every one is called, failures collected."""
    errors: list[tuple[str, BaseException]] = []
    journal = ctx.journal
    traced = spans.tracer is not None
    for provider in reversed(in_order(providers)[:journal.started]):
        span = hook_span(spans, provider.source_id, provider.kind, "after_run") if traced else None
        t0 = time.perf_counter()
        failure: BaseException | None = None
        try:
            await provider.after_run(ctx, outcome)
        except Exception as exc:
            errors.append((provider.source_id, exc))
            failure = exc
        finally:
            journal.timings.append(ProviderTiming(provider.source_id, "after_run", time.perf_counter() - t0))
            if span is not None:
                Spans.end(span, failure)
    return errors

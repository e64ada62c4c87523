"""`Compaction`: keeps every model call of a run within a token budget, before the run and inside the loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..budget import contributed_tokens, fit_history
from ..compaction import CompactionResult, CompactionStrategy, TokenBudget, compact, is_summary
from ..errors import UsageError
from ..messages import Message, Source
from ..models.base import CallModel, ModelRequest, ModelResponse
from ..tokens import TokenCache, TokenCounter, Tokenizer
from .base import ContextProvider

if TYPE_CHECKING:
    from ..pipeline import RunContext, RunOutcome, Segment

__all__ = ["Compaction"]


class Compaction(ContextProvider):
    """Compacts the context with `strategy` (by default `TokenBudget(max_input_tokens, output_reserve)`).

    Register it after the providers whose messages it should compact (history, memory, search):

    - in `before_run` it compacts what those providers contributed (`replace_messages`); when a
      summary replaces the oldest part of the stored history, it is saved as a checkpoint so later
      runs load the summary plus the newer messages, never the whole log;
    - with `in_loop` (the default) it also compacts every model call of the run, so a long tool
      loop stays within budget; summaries made inside the loop are reused on later calls.

    Stored messages are never changed. Token counts are the run's (``ctx.tokens``: exact for
    OpenAI-family model names, else an estimate calibrated against the usage models report, the
    calibration kept in session state), the same numbers the run's traces show; a `tokenizer`
    given here replaces the tokenizer but keeps that calibration. Every decision is recorded on the
    call's trace.

    It takes none of the seeds' message filters. It must see every message of the request to keep
    tool exchanges whole and the latest input in it, and it stores no message of the run (only
    summaries it wrote itself), so an input filter would break the request and a store filter
    would have nothing to choose.

    >>> Compaction(max_input_tokens=8_000, output_reserve=1_000).strategy.budget
    7000
    """

    kind = "compaction"
    budget_share = "history"
    """With a `contextpipe.budget.ContextBudget`, this provider is the history's rule (its summaries count as it)."""

    def __init__(
        self,
        strategy: CompactionStrategy | None = None,
        *,
        max_input_tokens: int | None = None,
        output_reserve: int = 0,
        tokenizer: Tokenizer | None = None,
        in_loop: bool = True,
        checkpoints: bool = True,
        source_id: str = "compaction",
    ) -> None:
        super().__init__(source_id)
        if strategy is None:
            if max_input_tokens is None:
                raise UsageError("Compaction needs a strategy or max_input_tokens=...")
            strategy = TokenBudget(max_input_tokens, output_reserve=output_reserve)
        self.strategy = strategy
        self.tokenizer = tokenizer
        self.in_loop = in_loop
        self.checkpoints = checkpoints
        self._cache = TokenCache()

    @property
    def history_tokens(self) -> int | None:
        """The most tokens of history this provider lets through (`CompactionStrategy.kept_tokens`), or None.

        A `History` registered before it loads no more than twice this of the log per run.
        """
        return self.strategy.kept_tokens

    def _counter(self, ctx: RunContext) -> TokenCounter:
        if self.tokenizer is None:
            return ctx.tokens
        # Each session counts into its own bounded part: a busy one cannot evict the others' counts.
        scope = (ctx.session.tenant, ctx.session.id) if ctx.session is not None else None
        return TokenCounter(self.tokenizer, calibration=ctx.tokens.calibration, cache=self._cache.scope(scope),
                            cache_size=self._cache.max_per_session)

    async def before_run(self, ctx: RunContext) -> None:
        """Compact the context contributed so far, and wrap each model call of the run."""
        counter = self._counter(ctx)
        input_ids = {m.id for m in ctx.input}
        result = await compact(list(ctx.messages), self.strategy, counter, instructions=ctx.instructions,
                               tools=[t.spec for t in ctx.tools.values()])
        if result.changed:
            history = next((s for s in ctx.segments if s.first_seq is not None), None)
            ctx.replace_messages([self._tagged(m) for m in result.messages if m.id not in input_ids])
            ctx.record_compaction(result.decisions)
            if self.checkpoints and result.summarised and history is not None:
                await self._checkpoint(ctx, result, history)
        if self.in_loop:
            ctx.add_middleware(_LoopCompaction(self, ctx, counter).call)

    def _tagged(self, message: Message) -> Message:
        """Attribute a summary this provider wrote to it (other messages keep their source)."""
        return message.with_source(Source("context", self.source_id)) if is_summary(message) and (
            message.source is None) else message

    def budget_tokens(self, ctx: RunContext) -> int:
        """Tokens of the loaded history and of the summaries this provider put in its place."""
        return contributed_tokens(ctx, [self.source_id], history=True)

    async def fit_budget(self, ctx: RunContext, allowance: int) -> None:
        """Drop the oldest groups (after this provider's own strategy ran) until the history fits `allowance`."""
        await fit_history(ctx, allowance, [self.source_id], strategy=f"{self.source_id} (budget)")

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Nothing to do: the calibration lives in session state, which the run saves."""

    async def _checkpoint(self, ctx: RunContext, result: CompactionResult, history: Segment) -> None:
        """Save the summary as a checkpoint when it stands for the oldest part of the stored log."""
        summary = next((m for m in result.messages if is_summary(m)), None)
        summarised = set(result.summarised)
        if summary is None or history.first_seq is None:
            return
        # The summary may cover an earlier checkpoint's summary and then a prefix of the loaded log.
        covered = [i for i, m in enumerate(history.messages) if m.id in summarised]
        in_history = len(covered)
        outside = len(summarised) - in_history
        if not covered or covered != list(range(in_history)) or outside > 1:
            return
        await ctx.save_checkpoint(history.first_seq + in_history - 1, summary)


class _LoopCompaction:
    """Model middleware: compacts each request of one run."""

    def __init__(self, provider: Compaction, ctx: RunContext, counter: TokenCounter) -> None:
        self.provider = provider
        self.ctx = ctx
        self.counter = counter
        self.summaries: list[tuple[tuple[str, ...], Message]] = []

    async def call(self, request: ModelRequest, call_next: CallModel) -> ModelResponse:
        messages = self._reuse_summaries(request.messages)
        result = await compact(messages, self.provider.strategy, self.counter, instructions=request.instructions,
                               tools=request.tools)
        if result.changed or messages is not request.messages:
            request = ModelRequest(tuple(self.provider._tagged(m) for m in result.messages), request.instructions,
                                   request.tools, request.settings)
            self.ctx.record_compaction(result.decisions)
            if result.summarised:
                summary = next(m for m in request.messages if is_summary(m))
                self.summaries.append((tuple(result.summarised), summary))
        response = await call_next(request)
        counter, run_counter = self.counter, self.ctx.tokens
        if response.usage is not None and counter is not run_counter:
            # With a tokenizer of its own this provider learns the (shared) calibration from its own
            # estimates, which it scales; the run then does not learn from this call (`_run.loop`).
            counter.learn(request.instructions, request.tools, request.messages, response.usage.input_tokens)
        return response

    def _reuse_summaries(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Put this run's earlier summaries back in place of the messages they stand for."""
        for covered, summary in self.summaries:
            ids = set(covered)
            positions = [i for i, m in enumerate(messages) if m.id in ids]
            if len(positions) != len(covered) or positions != list(range(positions[0], positions[0] + len(covered))):
                continue
            start = positions[0]
            messages = [*messages[:start], summary, *messages[start + len(covered):]]
        return messages

"""How much of a model call's prompt prefix matched the previous call's: `CacheCheck` and its comparison.

Vendors cache a prompt's prefix (Anthropic: tools, then system, then messages; OpenAI: the prompt's
start), so a call reuses the cache only as far as its prefix repeats the previous call's. The prefix
is compared block by block, in that order: tools by name and a digest of their definition,
instructions by source and text, messages by id. A `Prefix` is that sequence, taken from a trace or
from the compact fingerprint a run keeps in the session's state (`PROMPT_CACHE_KEY`) for the next run.

Messages are segments (`Segment`): one message each in a run's own traces; in a fingerprint, loaded
history is folded into runs of which only the first and last ids are kept. A position inside a run
is taken to match (the log is append-only; a compaction summary, a rewind or a provider's message
changes the ids at the runs' ends).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, TypeAlias

__all__ = ["MIN_CACHEABLE_TOKENS", "PROMPT_CACHE_KEY", "CacheCause", "CacheCheck", "Prefix", "Segment", "compare",
           "digest", "fold_history", "tool_digest"]

MIN_CACHEABLE_TOKENS: Final = 1024
"""The smallest prefix vendors cache (Anthropic's and OpenAI's minimum): a smaller previous prefix
cannot collapse, as there was no cache to lose."""

PROMPT_CACHE_KEY: Final = "contextpipe.prompt_cache"
"""Session state key of the last call's prefix fingerprint, kept only when the model reports cache use."""

CacheCause: TypeAlias = Literal["tools_changed", "instructions_changed", "compaction", "history_changed"]
"""What broke the prefix: a tool added, removed, reordered or redefined; a provider's instructions that
changed (or providers in another order); compaction that dropped, summarised or cleared messages of the
previous prefix; any other change of the messages (a rewind, a provider's message before the history)."""


def digest(text: str) -> str:
    """Return a short digest of `text` (a tool definition's canonical JSON, an instruction block)."""
    import hashlib  # lazily: `tests/test_import_cost.py` counts it heavy, and only a trace read needs it
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def tool_digest(name: str, description: str, parameters: dict[str, Any]) -> str:
    """Return the digest of a tool definition as sent: name, description and JSON schema."""
    return digest(json.dumps([name, description, parameters], sort_keys=True, ensure_ascii=False))


@dataclass(frozen=True, slots=True)
class Segment:
    """Messages at consecutive positions: one message, or a folded run of history."""

    count: int
    first_id: str
    last_id: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Prefix:
    """The blocks of one call's prompt in cache order, with their tokens."""

    tools: Sequence[tuple[str, str, int]]
    """``(name, digest, tokens)`` per tool, in the order offered."""
    instructions: Sequence[tuple[str, str, int]]
    """``(source_id, digest of the text, tokens)`` per instruction block."""
    messages: Sequence[Segment]
    """The messages, in order."""
    cached_tokens: int = 0
    """Cache tokens the model reported for the call (read plus written)."""
    compacted: Sequence[tuple[str, str, frozenset[str]]] = ()
    """``(strategy, action, message ids)`` of the compaction decisions made for the call that took messages away."""

    @property
    def tokens(self) -> int:
        """Tokens of the whole prefix."""
        return (sum(t[2] for t in self.tools) + sum(i[2] for i in self.instructions)
                + sum(s.tokens for s in self.messages))

    def to_state(self) -> dict[str, Any]:
        """Return the JSON form kept in session state (history runs folded; compaction is the next call's own)."""
        return {"v": 1, "tools": [list(t) for t in self.tools], "instructions": [list(i) for i in self.instructions],
                "messages": [[s.count, s.first_id, s.last_id, s.tokens] for s in self.messages],
                "cached_tokens": self.cached_tokens}

    @classmethod
    def from_state(cls, data: object) -> Prefix | None:
        """Read `to_state` output back; None for anything else (it is only a hint: a bad one is ignored)."""
        try:
            if not isinstance(data, dict) or data.get("v") != 1:
                return None
            return cls([(str(n), str(d), int(k)) for n, d, k in data["tools"]],
                       [(str(s), str(d), int(k)) for s, d, k in data["instructions"]],
                       [Segment(int(c), str(f), str(la), int(k)) for c, f, la, k in data["messages"]],
                       int(data["cached_tokens"]))
        except (KeyError, TypeError, ValueError):
            return None


def fold_history(messages: Iterable[tuple[str, str, int]]) -> list[Segment]:
    """Segments of ``(message_id, source_kind, tokens)``: consecutive history folded into one run."""
    out: list[Segment] = []
    folding = False
    for message_id, kind, tokens in messages:
        if kind == "history" and folding:
            last = out[-1]
            out[-1] = Segment(last.count + 1, last.first_id, message_id, last.tokens + tokens)
            continue
        folding = kind == "history"
        out.append(Segment(1, message_id, message_id, tokens))
    return out


@dataclass(frozen=True, slots=True)
class CacheCheck:
    """How much of a call's prompt prefix repeated the previous call's, and what broke it if it did not."""

    against: Literal["previous_call", "previous_run"]
    """Compared with the run's previous call, or with the last call of the session's previous run."""
    matched_tokens: int
    """Tokens of the previous prefix this call repeated, from the start."""
    previous_tokens: int
    """Tokens of the previous call's whole prefix."""
    broke_at: Literal["tools", "instructions", "messages"] | None = None
    """The first block that differs; None when the whole previous prefix repeated."""
    cause: CacheCause | None = None
    """What broke it (`CacheCause`)."""
    culprit: str | None = None
    """The tool, the provider whose instructions changed, the compaction strategy or the message id."""
    detail: str = ""
    """What differs, in words."""
    previous_cached_tokens: int = 0
    """Cache tokens the model reported for the previous call (read plus written)."""

    @property
    def lost_tokens(self) -> int:
        """Tokens of the previous prefix that no longer match."""
        return self.previous_tokens - self.matched_tokens

    @property
    def collapsed(self) -> bool:
        """True when a cacheable previous prefix (`MIN_CACHEABLE_TOKENS`) was less than half repeated."""
        return self.previous_tokens >= MIN_CACHEABLE_TOKENS and 2 * self.matched_tokens < self.previous_tokens

    def warning(self, step: int) -> str | None:
        """Return the warning text for call `step` when the cache collapsed, else None."""
        if not self.collapsed:
            return None
        reported = (f"; the previous call reported {self.previous_cached_tokens} cache tokens (read + written)"
                    if self.previous_cached_tokens else "")
        return (f"prompt cache collapsed at call {step} ({self.cause}: {self.detail}): {self.lost_tokens} of "
                f"{self.previous_tokens} prefix tokens of the {self.against.replace('_', ' ')} no longer match"
                + reported)

    def text(self) -> str:
        """One line for `PromptTrace.table`."""
        head = f"{self.matched_tokens}/{self.previous_tokens} prefix tokens match the {self.against.replace('_', ' ')}"
        return head if self.broke_at is None else f"{head}; broke at {self.broke_at}: {self.detail} ({self.cause})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with `lost_tokens` and `collapsed`."""
        return {**asdict(self), "lost_tokens": self.lost_tokens, "collapsed": self.collapsed}


def _first_difference(a: Sequence[tuple[str, str, int]], b: Sequence[tuple[str, str, int]]) -> int | None:
    """Index of the first block whose key (name or source, digest) differs, or where one list ends; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x[0] != y[0] or x[1] != y[1]:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _named(prev: Sequence[tuple[str, str, int]], cur: Sequence[tuple[str, str, int]], k: int,
           what: str) -> tuple[str, str]:
    """Return the culprit at the first difference `k` and what happened to it (added, removed, changed, moved)."""
    before = {b[0] for b in prev}
    after = {b[0] for b in cur}
    if k < len(prev) and k < len(cur) and prev[k][0] == cur[k][0]:
        return prev[k][0], f"{what} {prev[k][0]!r} changed"
    if k < len(prev) and prev[k][0] not in after:
        return prev[k][0], f"{what} {prev[k][0]!r} removed"
    if k < len(cur) and cur[k][0] not in before:
        return cur[k][0], f"{what} {cur[k][0]!r} added"
    name = cur[k][0] if k < len(cur) else prev[k][0]
    return name, f"{what} reordered: {name!r} moved"


def _ends(segments: Sequence[Segment]) -> tuple[dict[int, str], int]:
    """Known message ids by position (each segment's ends), and the number of positions."""
    known: dict[int, str] = {}
    pos = 0
    for s in segments:
        known[pos] = s.first_id
        known[pos + s.count - 1] = s.last_id
        pos += s.count
    return known, pos


def _message_break(prev: Sequence[Segment], cur: Sequence[Segment]) -> int | None:
    """First position where the previous messages stop repeating; None when all of them repeat."""
    before, length = _ends(prev)
    after, cur_length = _ends(cur)
    for pos in sorted(before):
        if pos >= cur_length:
            return pos
        other = after.get(pos)
        if other is not None and other != before[pos]:
            return pos
    return None if length <= cur_length else cur_length


def _tokens_before(segments: Sequence[Segment], end: int) -> int:
    """Tokens of the positions before `end` (a folded run counted pro rata)."""
    total = pos = 0
    for s in segments:
        if pos + s.count <= end:
            total += s.tokens
        elif pos < end:
            total += s.tokens * (end - pos) // s.count
        pos += s.count
    return total


def compare(prev: Prefix, cur: Prefix, against: Literal["previous_call", "previous_run"]) -> CacheCheck:
    """Compare `cur`'s prefix with `prev`'s in cache order: tools, instructions, messages."""
    total = prev.tokens

    def check(matched: int, broke_at: Literal["tools", "instructions", "messages"] | None = None,
              cause: CacheCause | None = None, culprit: str | None = None, detail: str = "") -> CacheCheck:
        return CacheCheck(against, matched, total, broke_at, cause, culprit, detail, prev.cached_tokens)

    k = _first_difference(prev.tools, cur.tools)
    if k is not None:
        return check(sum(t[2] for t in prev.tools[:k]), "tools", "tools_changed",
                     *_named(prev.tools, cur.tools, k, "tool"))
    matched = sum(t[2] for t in prev.tools)
    k = _first_difference(prev.instructions, cur.instructions)
    if k is not None:
        return check(matched + sum(i[2] for i in prev.instructions[:k]), "instructions", "instructions_changed",
                     *_named(prev.instructions, cur.instructions, k, "instructions of"))
    matched += sum(i[2] for i in prev.instructions)
    pos = _message_break(prev.messages, cur.messages)
    if pos is None:
        return check(total)
    matched += _tokens_before(prev.messages, pos)
    known = _ends(prev.messages)[0]
    ids = set(known.values())
    for strategy, action, taken in cur.compacted:
        if taken & ids:
            return check(matched, "messages", "compaction", strategy,
                         f"compaction {strategy!r} {action} messages of the previous prefix")
    culprit = known.get(pos)
    return check(matched, "messages", "history_changed", culprit,
                 f"the messages differ from position {pos}" + (f" (message {culprit})" if culprit else ""))

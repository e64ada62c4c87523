"""Markdown-aware chunking by token count, and folder ingestion with source and heading for citations."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contextpipe import UsageError
from contextpipe.tokens import TiktokenTokenizer
from contextpipe.vectors import HashEmbedder, MemoryVectorStore, chunk_markdown, ingest_folder

TOKENIZER = TiktokenTokenizer("cl100k_base")

GUIDE = """# Deploying the service

Build the image first. The build needs Docker 24 or newer.

## On Linux

Install the packages:

```sh
apt-get install -y docker.io

systemctl enable --now docker
```

Then run the service.

## On macOS

Use Docker Desktop.

### Apple silicon

Pass `--platform linux/amd64` when the base image has no arm64 build.
"""


def check_invariants(text: str, chunks: list, limit: int) -> None:
    covered = [False] * len(text)
    last_end = 0
    for c in chunks:
        assert text[c.start:c.end] == c.text and c.text == c.text.strip() and c.text
        assert c.start >= last_end  # in order, no overlap
        last_end = c.end
        assert TOKENIZER.count_text(c.text) <= limit
        for i in range(c.start, c.end):
            covered[i] = True
    missed = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert missed == []


def test_sections_code_blocks_and_heading_paths() -> None:
    chunks = chunk_markdown(GUIDE, max_tokens=60, tokenizer=TOKENIZER)
    check_invariants(GUIDE, chunks, 60)
    assert [c.heading for c in chunks] == [
        "Deploying the service", "Deploying the service > On Linux", "Deploying the service > On macOS",
        "Deploying the service > On macOS > Apple silicon"]
    linux = chunks[1].text
    assert linux.startswith("## On Linux") and "```sh\napt-get install -y docker.io\n\nsystemctl" in linux
    assert linux.endswith("Then run the service.")


def test_a_code_block_is_cut_only_when_it_does_not_fit() -> None:
    code = "```python\n" + "\n".join(f"value_{i} = compute({i}, scale=2.5)" for i in range(60)) + "\n```"
    doc = f"# Reference\n\nThe table below.\n\n{code}\n\nAfter the code.\n"
    whole = chunk_markdown(doc, max_tokens=2000, tokenizer=TOKENIZER)
    assert len(whole) == 1
    cut = chunk_markdown(doc, max_tokens=100, tokenizer=TOKENIZER)
    check_invariants(doc, cut, 100)
    assert len(cut) > 5 and all(c.heading == "Reference" for c in cut)
    assert all("\n" not in c.text[-1:] for c in cut)
    inner = [c for c in cut if "value_" in c.text]
    assert all(c.text.split("\n")[-1].startswith(("value_", "```")) for c in inner)  # cut at line breaks


def test_headings_inside_code_blocks_are_not_headings() -> None:
    doc = "# Shell\n\n```sh\n# this is a comment\necho hi\n```\n"
    [chunk] = chunk_markdown(doc, max_tokens=100, tokenizer=TOKENIZER)
    assert chunk.heading == "Shell" and chunk.text == doc.strip()


def test_plain_text_ignores_markdown_and_bad_limits_are_refused() -> None:
    text = "# not a heading in a .txt file\n\nsecond paragraph"
    [chunk] = chunk_markdown(text, max_tokens=50, tokenizer=TOKENIZER, markdown=False)
    assert chunk.heading == ""
    with pytest.raises(UsageError, match="max_tokens"):
        chunk_markdown(text, max_tokens=2)


markdown_lines = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300),
    st.from_regex(r"#{1,7} [a-zA-Z ]{0,30}", fullmatch=True),
    st.sampled_from(["```", "```python", "~~~", "", "", "- item", "| a | b |", "    indented code"]),
    st.builds(lambda n, w: " ".join([w] * n), st.integers(0, 400), st.sampled_from(["word", "Δοκιμή", "x" * 50])),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(markdown_lines, max_size=40), st.integers(8, 200))
@example(["0:0:\x1f\U00010000"], 8)  # a cut inside a word ending in a whitespace control character
def test_chunks_cover_the_text_and_none_is_over_the_limit(lines: list[str], limit: int) -> None:
    text = "\n".join(lines)
    check_invariants(text, chunk_markdown(text, max_tokens=limit, tokenizer=TOKENIZER), limit)


async def test_ingest_keeps_source_and_heading_for_citations(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "ops").mkdir(parents=True)
    (docs / "ops" / "deploy.md").write_text("\ufeff" + GUIDE, encoding="utf-8")
    (docs / "notes.txt").write_text("# plain\n\nShipping takes 5 days.", encoding="utf-8")
    vectors, embedder = MemoryVectorStore(), HashEmbedder()
    count = await ingest_folder(docs, vectors, embedder, max_tokens=60, tokenizer=TOKENIZER)
    assert count == 5 and await vectors.count("documents") == 5
    [vector] = await embedder.embed(["Pass --platform linux/amd64 when the base image has no arm64 build"])
    [hit] = await vectors.search("documents", vector, k=1)
    assert hit.metadata["source"] == "ops/deploy.md"
    assert hit.metadata["heading"] == "Deploying the service > On macOS > Apple silicon"
    assert hit.text.startswith("### Apple silicon")
    [vector] = await embedder.embed(["Shipping takes 5 days."])
    [hit] = await vectors.search("documents", vector, k=1)
    assert (hit.metadata["source"], hit.metadata["heading"]) == ("notes.txt", "")
    (docs / "ops" / "deploy.md").write_text("# Deploying\n\nShort now.", encoding="utf-8")
    assert await ingest_folder(docs, vectors, embedder, max_tokens=60, tokenizer=TOKENIZER) == 2
    assert await vectors.count("documents") == 2  # the old chunks of the shortened file are gone

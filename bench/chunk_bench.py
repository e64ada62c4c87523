#!/usr/bin/env python3
"""Chunk every Markdown file under a folder with `chunk_markdown` and report throughput and chunk sizes.

    python bench/chunk_bench.py /usr/share/doc            # any folder of real .md files
    python bench/chunk_bench.py docs/ --max-tokens 512

Counts tokens with the cl100k_base tokenizer (exact). Prints files, MB, chunks, seconds, MB/s, and
the distribution of chunk sizes in tokens (every chunk must be at or under the limit).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _harness as h
from contextpipe.tokens import TiktokenTokenizer
from contextpipe.vectors import chunk_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    tokenizer = TiktokenTokenizer("cl100k_base")
    texts = [p.read_text(encoding="utf-8-sig", errors="replace") for p in sorted(args.folder.rglob("*.md"))
             if p.is_file()]
    size = sum(len(t.encode()) for t in texts)
    with h.Stopwatch() as watch:
        chunks = [c for t in texts for c in chunk_markdown(t, max_tokens=args.max_tokens, tokenizer=tokenizer)]
    seconds = watch.wall
    tokens = [tokenizer.count_text(c.text) for c in chunks]
    with_heading = sum(1 for c in chunks if c.heading)
    print(f"files {len(texts)}  MB {size / 1e6:.2f}  chunks {len(chunks)}  seconds {seconds:.2f}  "
          f"MB/s {size / 1e6 / seconds:.2f}")
    print(f"tokens per chunk: median {h.stats(tokens)['median']:.0f}  p90 {sorted(tokens)[len(tokens) * 9 // 10]}  "
          f"max {max(tokens)} (limit {args.max_tokens})  chunks with a heading {with_heading / len(chunks):.0%}")
    assert max(tokens) <= args.max_tokens


if __name__ == "__main__":
    main()

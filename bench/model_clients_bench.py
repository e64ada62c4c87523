#!/usr/bin/env python3
"""What the vendor clients cost on top of the wire: request building, and whole calls against local fakes.

    python bench/model_clients_bench.py              # about a minute
    python bench/model_clients_bench.py --quick

1. Request building: a stored session of N messages (tool exchanges with each vendor's reasoning)
   turned into each API's request body (`_build`), median microseconds per call.
2. A 10-step tool loop per client through the official SDK against the local fake servers (HTTP on
   127.0.0.1, streaming): median milliseconds per model call, and for Claude the share of input
   tokens read from the (simulated) prompt cache.
3. Tool results with images: a session of 40 messages whose 20 tool results each carry a 200 KB
   PNG (screenshot-sized, as MCP browser tools return them); CPU milliseconds to build each API's
   request (base64 included) and to estimate the session's tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import zlib
from typing import Any

import _harness as h
from contextpipe import Agent, FunctionCall, FunctionResult, Message, ReasoningPart, TextPart, tool
from contextpipe.messages import DataPart
from contextpipe.models import AnthropicChatModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel
from contextpipe.testing import AnthropicReply, FakeAnthropicServer, FakeOpenAIServer, FakeReply
from contextpipe.testing.fake_anthropic import signature_for
from contextpipe.tokens import EstimateTokenizer, TokenCounter


@tool
def lookup(key: str) -> str:
    """Return the stored value for a key."""
    return f"value of {key}: " + "data " * 30


def session(n: int) -> list[Message]:
    messages: list[Message] = [Message.user("Look up the keys one by one.")]
    i = 0
    while len(messages) < n:
        thought = f"Next I need key {i}."
        messages.append(Message("assistant", (
            ReasoningPart(thought, signature_for(thought), "anthropic.thinking"),
            ReasoningPart("summary", f"enc_{i}", "openai.reasoning", f"rs_{i}"),
            TextPart(f"Looking up k{i}."), FunctionCall(f"call_{i}", "lookup", f'{{"key": "k{i}"}}'))))
        messages.append(Message("tool", (FunctionResult(f"call_{i}", f"value of k{i}: " + "data " * 30),)))
        i += 1
    return messages


def bench_build(sizes: list[int], repeats: int) -> None:
    claude = AnthropicChatModel("claude-fake", api_key="k")
    responses = OpenAIResponsesModel("gpt-fake", api_key="k")
    chat = OpenAIChatModel("gpt-fake", api_key="k")
    print("| messages | Messages API (µs) | Responses API (µs) | chat completions (µs) |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        request = ModelRequest(session(n), instructions="Be brief.", tools=[lookup.spec])
        row = []
        builders: list[Any] = [claude._build, responses._build, chat._build]
        for build in builders:
            times = [s.wall for s in h.measure(lambda build=build, request=request: build(request), repeats, 0)]
            row.append(h.stats(times)["median"] * 1e6)
        print(f"| {n} | {row[0]:.0f} | {row[1]:.0f} | {row[2]:.0f} |")


async def bench_loop(steps: int, runs: int) -> None:
    print()
    print(f"| client | ms per model call ({steps}-step loop, median of {runs}) | input tokens read from cache |")
    print("|---|---:|---:|")
    with FakeOpenAIServer() as openai_fake, FakeAnthropicServer() as claude_fake:
        clients: list[tuple[str, Any, Any, Any]] = [
            ("chat completions", OpenAIChatModel("gpt-fake", base_url=openai_fake.base_url, max_retries=0),
             openai_fake, FakeReply),
            ("Responses API", OpenAIResponsesModel("gpt-fake", base_url=openai_fake.base_url, max_retries=0),
             openai_fake, FakeReply),
            ("Messages API", AnthropicChatModel("claude-fake", base_url=claude_fake.base_url, api_key="k",
                                                max_retries=0), claude_fake, AnthropicReply),
        ]
        for name, model, fake, reply in clients:
            per_call: list[float] = []
            read = total = 0
            for _ in range(runs):
                script = [reply(tool_calls=(("lookup", f'{{"key": "k{i}"}}'),)) for i in range(steps - 1)]
                fake.enqueue(*script, reply("All looked up."))
                agent = Agent(model, instructions="Look things up. " * 50, tools=[lookup])
                with h.Stopwatch() as watch:
                    async with agent.stream("Look up the keys.") as events:
                        async for _event in events:
                            pass
                per_call.append(watch.wall / steps * 1000)
                assert events.result is not None
                read += events.result.usage.cache_read_tokens
                total += events.result.usage.input_tokens
            share = f"{read / total:.0%}" if read else "n/a"
            print(f"| {name} | {h.stats(per_call)['median']:.1f} | {share} |")
            await model.close()


def screenshot(size: int) -> bytes:
    """A PNG of about `size` bytes (1280 x 800, incompressible pixel data)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1280, 800, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", os.urandom(size)) + chunk(b"IEND", b"")


def bench_media(repeats: int) -> None:
    messages: list[Message] = [Message.user("Click through the page and describe it.")]
    for i in range(20):
        messages.append(Message("assistant", (FunctionCall(f"call_{i}", "screenshot", "{}"),)))
        messages.append(Message("tool", (FunctionResult(f"call_{i}", f"Screenshot {i}.",
                                                        parts=(DataPart(screenshot(200_000), "image/png"),)),)))
    request = ModelRequest(messages, instructions="Be brief.")
    builders: list[tuple[str, Any]] = [
        ("Messages API", AnthropicChatModel("claude-fake", api_key="k")._build),
        ("Responses API", OpenAIResponsesModel("gpt-fake", api_key="k")._build),
        ("chat completions", OpenAIChatModel("gpt-fake", api_key="k")._build),
        ("token estimate", lambda r: TokenCounter(EstimateTokenizer()).messages(r.messages)),
    ]
    print()
    print(f"| 20 tool results with a 200 KB image each | CPU ms (median of {repeats}) |")
    print("|---|---:|")
    for name, build in builders:
        times = [s.cpu for s in h.measure(lambda build=build: build(request), repeats, warmup=0)]
        print(f"| {name} | {h.stats(times)['median'] * 1000:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    bench_build([50, 500, 2000] if not args.quick else [50, 500], 30 if not args.quick else 5)
    asyncio.run(bench_loop(10, 9 if not args.quick else 3))
    bench_media(15 if not args.quick else 3)


if __name__ == "__main__":
    main()

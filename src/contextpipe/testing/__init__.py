"""Test doubles for contextpipe users: a scripted model and fake OpenAI and Anthropic HTTP servers.

`contextpipe.testing.wire` validates vendor request bodies (the fakes' checks and the SDKs' types).

>>> from contextpipe.testing import ScriptedModel, tool_call
>>> model = ScriptedModel([tool_call("lookup", key="k1"), "done"])
"""

from __future__ import annotations

from .fake_anthropic import AnthropicReply, FakeAnthropicCut, FakeAnthropicServer
from .fake_openai import FakeError, FakeOpenAIServer, FakeRaw, FakeReply, FakeStreamCut, FakeStreamError
from .scripted import ScriptedModel, ScriptStep, Turn, tool_call

__all__ = [
    "AnthropicReply",
    "FakeAnthropicCut",
    "FakeAnthropicServer",
    "FakeError",
    "FakeOpenAIServer",
    "FakeRaw",
    "FakeReply",
    "FakeStreamCut",
    "FakeStreamError",
    "ScriptStep",
    "ScriptedModel",
    "Turn",
    "tool_call",
]

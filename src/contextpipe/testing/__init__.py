"""Test doubles for contextpipe users: a scripted model and a fake OpenAI-compatible server.

>>> from contextpipe.testing import ScriptedModel, tool_call
>>> model = ScriptedModel([tool_call("lookup", key="k1"), "done"])
"""

from __future__ import annotations

from .fake_openai import FakeError, FakeOpenAIServer, FakeRaw, FakeReply, FakeStreamCut
from .scripted import ScriptedModel, Turn, tool_call

__all__ = [
    "FakeError",
    "FakeOpenAIServer",
    "FakeRaw",
    "FakeReply",
    "FakeStreamCut",
    "ScriptedModel",
    "Turn",
    "tool_call",
]

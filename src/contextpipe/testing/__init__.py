"""Test doubles for contextpipe users: a scripted model and fake OpenAI and Anthropic HTTP servers.

`contextpipe.testing.wire` validates vendor request bodies (the fakes' checks and the SDKs' types).
The fake servers are imported when first named, so ``python -m contextpipe.testing.fake_openai``
(a fake server on its own) runs its module once.

>>> from contextpipe.testing import ScriptedModel, tool_call
>>> model = ScriptedModel([tool_call("lookup", key="k1"), "done"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .scripted import ScriptedModel, ScriptStep, Turn, tool_call

if TYPE_CHECKING:
    from .fake_anthropic import AnthropicReply, FakeAnthropicCut, FakeAnthropicServer
    from .fake_openai import FakeError, FakeOpenAIServer, FakeRaw, FakeReply, FakeStreamCut, FakeStreamError

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

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("AnthropicReply", "FakeAnthropicCut", "FakeAnthropicServer"), ".fake_anthropic"),
    **dict.fromkeys(("FakeError", "FakeOpenAIServer", "FakeRaw", "FakeReply", "FakeStreamCut", "FakeStreamError"),
                    ".fake_openai"),
}, submodules=("wire", "fake_openai", "fake_anthropic"))

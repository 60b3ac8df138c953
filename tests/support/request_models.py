"""OpenAI request models built the short way, for tests of their validation and conversion."""

from __future__ import annotations

from typing import Any

from app.openai.chat import ChatCompletionRequest
from app.openai.completions import CompletionRequest

MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw: Any) -> ChatCompletionRequest:
    kw.setdefault("messages", MSGS)
    return ChatCompletionRequest(model="m", **kw)


def completion(**kw: Any) -> CompletionRequest:
    kw.setdefault("prompt", "hi")
    return CompletionRequest(model="m", **kw)

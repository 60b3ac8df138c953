"""`POST /tokenize` and `POST /detokenize` on the wire, in vLLM's shapes."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from app.openai.json_depth import BoundedBody


class TokenizeRequest(BoundedBody):
    """vLLM's /tokenize body: exactly one of a prompt or chat messages."""

    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None


class DetokenizeRequest(BoundedBody):
    """vLLM's /detokenize body."""

    model_config = ConfigDict(extra="forbid")
    model: str
    tokens: list[int] = Field(..., max_length=1_000_000)

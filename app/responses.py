"""From neutral engine output to OpenAI response objects. No HTTP, no engine.

A `Responder` consumes the `Admitted` item and the `GenerationDelta`s of one
request and produces either the chunk objects of a stream or the one final
response object. Chat and completions differ only in the shapes of a choice,
which `ChatShape` and `CompletionShape` own.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine import Admitted, ChoiceDelta, GenerationDelta, TokenLogprob


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class ChatShape:
    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"

    @staticmethod
    def logprobs(lps: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict[str, Any]:
        return {
            "content": [
                {
                    "token": lp.token,
                    "logprob": lp.logprob,
                    "bytes": _utf8(lp.token),
                    "top_logprobs": [{"token": t, "logprob": v, "bytes": _utf8(t)} for t, v in lp.top],
                }
                for lp in lps
            ]
        }

    def chunk_choice(self, c: ChoiceDelta, first: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant", "content": c.text} if first else {"content": c.text}
        return {
            "index": c.index,
            "delta": delta,
            "logprobs": self.logprobs(c.logprobs) if c.logprobs is not None else None,
            "finish_reason": c.finish_reason,
        }

    def full_choice(self, acc: _ChoiceState) -> dict[str, Any]:
        return {
            "index": acc.index,
            "message": {"role": "assistant", "content": acc.text},
            "logprobs": self.logprobs(acc.logprobs) if acc.logprobs is not None else None,
            "finish_reason": acc.finish_reason,
        }


class CompletionShape:
    object_full = "text_completion"
    object_chunk = "text_completion"

    def __init__(self, echo_text: str | None = None):
        self.echo_text = echo_text
        self._offsets: dict[int, int] = {}  # choice index -> where its next streamed text starts

    @staticmethod
    def logprobs(lps: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
        offsets, pos = [], offset
        for lp in lps:
            offsets.append(pos)
            pos += len(lp.token)
        return {
            "tokens": [lp.token for lp in lps],
            "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{t: v for t, v in lp.top} for lp in lps],
            "text_offset": offsets,
        }

    def chunk_choice(self, c: ChoiceDelta, first: bool) -> dict[str, Any]:
        text = (self.echo_text or "") + c.text if first else c.text
        start = self._offsets.get(c.index, len(self.echo_text or ""))  # text_offset counts from the choice's whole text
        self._offsets[c.index] = start + len(c.text)
        return {
            "index": c.index,
            "text": text,
            "logprobs": self.logprobs(c.logprobs, start) if c.logprobs is not None else None,
            "finish_reason": c.finish_reason,
        }

    def full_choice(self, acc: _ChoiceState) -> dict[str, Any]:
        return {
            "index": acc.index,
            "text": (self.echo_text or "") + acc.text,
            "logprobs": self.logprobs(acc.logprobs, len(self.echo_text or "")) if acc.logprobs is not None else None,
            "finish_reason": acc.finish_reason,
        }


@dataclass
class _ChoiceState:
    index: int
    text: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    started: bool = False


@dataclass
class Responder:
    request_id: str
    model: str
    shape: ChatShape | CompletionShape
    n: int
    include_usage: bool = False
    # vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far (with include_usage)
    continuous_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        self._choices = [_ChoiceState(i) for i in range(self.n)]

    def admitted(self, item: Admitted) -> None:
        self.prompt_tokens = item.prompt_tokens

    def _absorb(self, c: ChoiceDelta) -> _ChoiceState:
        acc = self._choices[c.index]
        acc.text += c.text
        acc.tokens += c.num_tokens
        acc.finish_reason = c.finish_reason or acc.finish_reason
        if c.logprobs is not None:
            acc.logprobs = (acc.logprobs or []) + list(c.logprobs)
        return acc

    def usage(self) -> dict[str, int]:
        completion = sum(c.tokens for c in self._choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, delta: GenerationDelta) -> dict[str, Any]:
        choices = []
        for c in delta.choices:
            acc = self._absorb(c)
            choices.append(self.shape.chunk_choice(c, first=not acc.started))
            acc.started = True
        out = self._envelope(self.shape.object_chunk)
        out["choices"] = choices
        if self.include_usage:
            out["usage"] = self.usage() if self.continuous_usage else None
        return out

    def usage_chunk(self) -> dict[str, Any]:
        out = self._envelope(self.shape.object_chunk)
        out["choices"] = []
        out["usage"] = self.usage()
        return out

    def full(self) -> dict[str, Any]:
        out = self._envelope(self.shape.object_full)
        out["choices"] = [self.shape.full_choice(c) for c in self._choices]
        out["usage"] = self.usage()
        return out

    async def collect(self, stream: AsyncGenerator[GenerationDelta, None]) -> dict[str, Any]:
        async for delta in stream:
            for c in delta.choices:
                self._absorb(c)
        return self.full()

"""From neutral engine output to OpenAI response objects. No HTTP, no engine.

A `Responder` consumes the `Admitted` item and the `GenerationDelta`s of one request and produces either the
chunk objects of a stream or the one final response object; the shapes of a choice are `choice_shapes`'.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.engine.interface import Admitted, ChoiceDelta, GenerationDelta
from app.openai.choice_shapes import (
    ChatShape,
    ChoiceState,
    CompletionShape,
    prompt_logprobs_json,
    prompt_scores,
)
from app.openai.tool_calls import ToolCall


class StreamWriter(Protocol):
    """What the route needs of one request's output, whichever API: the events of a stream (payloads; the route
    frames them, app/http/sse.py) or the one body. `Responder` (chat, completions) and the Responses API's writer
    (app/openai/responses_events.py) are the two."""

    named_events: bool  # each event also names its type (the Responses API)
    ends_with_done: bool  # `data: [DONE]` after the last event (chat, completions)

    @property
    def request_id(self) -> str: ...

    def admitted(self, item: Admitted, *more: Admitted) -> None:
        """`more`: the admissions of a batch's other prompts, in order."""
        ...

    def opening(self) -> list[dict[str, Any]]: ...

    def events(self, delta: GenerationDelta) -> list[dict[str, Any]]: ...

    def closing(self) -> list[dict[str, Any]]: ...

    def error_events(self, body: dict[str, Any]) -> list[dict[str, Any]]: ...

    async def collect(self, stream: AsyncGenerator[GenerationDelta, None]) -> dict[str, Any]: ...


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
    # vLLM's return_token_ids: chat puts the prompt's ids on the response (its first chunk), completions on each
    # choice (its first chunk); every choice (chunk) has its output's ids. Without it the same fields say null.
    return_token_ids: bool = False
    # Prompt tokens the engine found in its prefix cache, over every prompt (the Responses API's usage always says
    # it; chat's and completions' with `prompt_tokens_details`).
    cached_tokens: int = 0
    created_cache_tokens: int | None = None  # ... and those the engine wrote there (vLLM's chat usage says it)
    # vLLM's --enable-prompt-tokens-details (`service.enable_prompt_tokens_details`): usage's
    # `prompt_tokens_details.cached_tokens`; off (vLLM's default), `prompt_tokens_details` is null.
    prompt_tokens_details: bool = False

    def __post_init__(self) -> None:
        self._choices = [ChoiceState(i) for i in range(self.n)]
        self._chunk_sent = False  # a stream's first chunk has gone (chat's carries the prompt's ids)

    named_events = False  # chat and completions events are plain `data:` lines
    ends_with_done = True  # then `data: [DONE]`

    def admitted(self, item: Admitted, *more: Admitted) -> None:
        """`more`: a batch's other prompts; usage counts every prompt's tokens, as vLLM's does."""
        items = (item, *more)
        self.prompt_tokens = sum(i.prompt_tokens for i in items)
        if isinstance(self.shape, CompletionShape):
            for prompt, i in enumerate(items):
                if i.prompt_text is not None and prompt < len(self.shape.echo_texts):
                    self.shape.echo_texts[prompt] = i.prompt_text  # a token-id prompt's text, decoded by the engine

    def _absorb(self, c: ChoiceDelta, delta: GenerationDelta | None = None) -> ChoiceState:
        acc = self._choices[c.index]
        if delta is not None and delta.prompt_token_ids is not None:  # its prompt's, for each choice of that prompt
            for same in self._prompt_group(c.index):  # (a later delta may bring a choice's first output)
                if same.prompt_token_ids is None:
                    same.prompt_token_ids = list(delta.prompt_token_ids)
        if delta is not None and delta.prompt_logprobs is not None and acc.prompt_logprobs is None:
            acc.prompt_logprobs = prompt_logprobs_json(delta.prompt_logprobs)
            if isinstance(self.shape, CompletionShape) and self.shape.echo_logprobs:  # one prompt's, its n choices'
                self.shape.prompt_scores.setdefault(c.index // self.shape.n,
                                                    prompt_scores(delta.prompt_first_token, delta.prompt_logprobs))
        if c.token_ids is not None:
            acc.token_ids += c.token_ids
        acc.text += c.text
        acc.tokens += c.num_tokens
        acc.finish_reason = c.finish_reason or acc.finish_reason
        acc.stop_reason = c.stop_reason if c.stop_reason is not None else acc.stop_reason
        if c.logprobs is not None:
            acc.logprobs = (acc.logprobs or []) + list(c.logprobs)
        for t in c.tool_calls:
            known = acc.tool_calls.get(t.index)
            acc.tool_calls[t.index] = (
                ToolCall(t.id or "", t.name or "", t.arguments)
                if known is None
                else ToolCall(known.id, known.name, known.arguments + t.arguments)
            )
        return acc

    def _prompt_group(self, index: int) -> list[ChoiceState]:
        """The choices of choice `index`'s prompt: a completions batch's prompt i has choices i * n .. i * n + n - 1;
        chat has one prompt."""
        if not isinstance(self.shape, CompletionShape):
            return self._choices
        per_prompt = max(1, self.shape.n)
        return self._choices[index // per_prompt * per_prompt:][:per_prompt]

    def _counts(self) -> dict[str, Any]:
        completion = sum(c.tokens for c in self._choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def usage(self) -> dict[str, Any]:
        """The whole answer's usage as vLLM's server sends it: `prompt_tokens_details` (what the prefix cache
        saved) only where the operator turned it on, else null."""
        details: dict[str, Any] | None = {"cached_tokens": self.cached_tokens} if self.prompt_tokens_details else None
        if details is not None and isinstance(self.shape, ChatShape) and self.created_cache_tokens is not None:
            details["created_cache_tokens"] = self.created_cache_tokens  # vLLM's chat says it, its completions not
        return {**self._counts(), "prompt_tokens_details": details}

    def _count_cache(self, delta: GenerationDelta) -> None:
        self.cached_tokens += delta.cached_tokens or 0
        if delta.created_cache_tokens is not None:
            self.created_cache_tokens = (self.created_cache_tokens or 0) + delta.created_cache_tokens

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def _with_token_ids(self, choice: dict[str, Any], acc: ChoiceState, ids: list[int] | None,
                        first: bool, streamed: bool = False) -> dict[str, Any]:
        """vLLM's token-id fields, on every choice (clients read them unconditionally): null unless asked for; a
        completions choice's prompt ids on its first chunk only (chat's are the answer's, `_prompt_ids`), where a
        streamed `echo` sends them unasked, as vLLM's does."""
        if isinstance(self.shape, CompletionShape):
            shown = self.return_token_ids or (streamed and bool(self.shape.echo_texts))
            choice["prompt_token_ids"] = acc.prompt_token_ids if first and shown else None
        choice["token_ids"] = ids if self.return_token_ids else None
        return choice

    def _prompt_ids(self) -> list[int] | None:
        """Chat's prompt ids (one prompt, every choice's), with return_token_ids."""
        return self._choices[0].prompt_token_ids if self.return_token_ids and self._choices else None

    def chunks(self, delta: GenerationDelta) -> list[dict[str, Any]]:
        """The stream chunks of `delta`, one per choice as vLLM's server and OpenAI send them (a client written
        against them reads `choices[0]` of each); none for a choice with nothing to tell (forced tool-call JSON
        whose next call is not yet readable), as vLLM sends no chunk then."""
        self._count_cache(delta)
        out = []
        for c in delta.choices:
            acc = self._absorb(c, delta)
            first = not acc.started
            choice = self.shape.chunk_choice(c, first=first)
            if c.finish_reason is not None:  # vLLM's extension, on the chunk that ends the choice
                choice["stop_reason"] = acc.stop_reason
            acc.started = True
            if not self.return_token_ids and (
                    choice.get("delta") == {} and choice["finish_reason"] is None and choice["logprobs"] is None):
                continue
            out.append(self._chunk_of(self._with_token_ids(choice, acc, list(c.token_ids or ()), first,
                                                           streamed=True)))
        return out

    def _chunk_of(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = self._envelope(self.shape.object_chunk)
        if isinstance(self.shape, ChatShape) and not self._chunk_sent:
            # vLLM's: the prompt's ids on a chat stream's first chunk (null unless asked for), and no such key on
            # any later one (its later chunks leave the field unset).
            out["prompt_token_ids"] = self._prompt_ids()
        out["choices"] = [choice]
        if self.include_usage:
            # vLLM's per-chunk usage is the bare counts
            out["usage"] = self._counts() if self.continuous_usage else None
        self._chunk_sent = True
        return out

    # The stream as the route writes it (the same calls as the Responses API's writer, app/openai/responses_events.py).

    def opening(self) -> list[dict[str, Any]]:
        return []

    def events(self, delta: GenerationDelta) -> list[dict[str, Any]]:
        return self.chunks(delta)

    def closing(self) -> list[dict[str, Any]]:
        return [self.usage_chunk()] if self.include_usage else []

    def error_events(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return [body]  # the OpenAI error object as one event

    def usage_chunk(self) -> dict[str, Any]:
        out = self._envelope(self.shape.object_chunk)
        out["choices"] = []
        # vLLM leaves a stream's null usage fields out (`prompt_tokens_details` unless turned on)
        out["usage"] = {k: v for k, v in self.usage().items() if v is not None}
        return out

    def full(self) -> dict[str, Any]:
        out = self._envelope(self.shape.object_full)
        # vLLM's `stop_reason` on every choice: the stop token id or string that ended it, else null.
        out["choices"] = [self._with_token_ids({**self.shape.full_choice(c), "stop_reason": c.stop_reason}, c,
                                               c.token_ids, True) for c in self._choices]
        # vLLM's shapes: `prompt_logprobs` on a chat answer and on each completions choice, and chat's
        # `prompt_token_ids`, null unless asked for (clients read the attributes unconditionally).
        if isinstance(self.shape, ChatShape):
            out["prompt_token_ids"] = self._prompt_ids()
            out["prompt_logprobs"] = self._choices[0].prompt_logprobs if self._choices else None
        else:  # a prompt's choices share its logprobs (the engine may send them with one of the choices only)
            for choice, c in zip(out["choices"], self._choices, strict=True):
                choice["prompt_logprobs"] = next(
                    (g.prompt_logprobs for g in self._prompt_group(c.index) if g.prompt_logprobs is not None), None)
        out["usage"] = self.usage()
        return out

    async def collect(self, stream: AsyncGenerator[GenerationDelta, None]) -> dict[str, Any]:
        async for delta in stream:
            self._count_cache(delta)
            for c in delta.choices:
                self._absorb(c, delta)
        return self.full()

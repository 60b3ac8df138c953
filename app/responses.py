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
from typing import Any, Protocol

from app.engine import Admitted, ChoiceDelta, GenerationDelta, PromptTokenLogprob, TokenLogprob, ToolCallDelta
from app.tool_calls import REQUIRED, ForcedCalls, ToolCall


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class ChatShape:
    """Chat's choices. With `forced_tool_choice` ("required" or a function's name) the text is the JSON that
    decoding was held to, and the choice carries it as tool calls (app/tool_calls.py); calls an engine's
    tool-call parser found (tool_choice "auto") arrive as `ChoiceDelta.tool_calls`. With `echo_text` (vLLM's
    `echo`: the final message's content, when that message is the assistant's) each choice's content starts
    with it."""

    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def __init__(self, forced_tool_choice: str | None = None, echo_text: str | None = None, role: str = "assistant",
                 top_logprobs: int | None = None):
        self.forced_tool_choice = forced_tool_choice
        self.echo_text = echo_text if forced_tool_choice is None else None
        self.role = role  # vLLM's: "assistant", or the last message's role when no generation prompt was added
        self.top_logprobs = top_logprobs  # how many of each token's alternatives to show (None: all given)
        self._forced: dict[int, ForcedCalls] = {}  # choice index -> its calls so far (streaming)
        self._called: set[int] = set()  # choices with a tool call streamed

    def logprobs(self, lps: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict[str, Any]:
        # The engine gives the chosen token first, then the top ones (vllm_engine._logprobs); chat shows the first
        # `top_logprobs` of them, as vLLM's server does.
        return {
            "content": [
                {
                    "token": lp.token,
                    "logprob": lp.logprob,
                    "bytes": _utf8(lp.token),
                    "top_logprobs": [{"token": t, "logprob": v, "bytes": _utf8(t)}
                                     for t, v in lp.top[: self.top_logprobs]],
                }
                for lp in lps
            ]
        }

    def _finish_reason(self, reason: str | None, called: bool) -> str | None:
        # OpenAI's (and vLLM's): "tool_calls" when "required" or the model's own choice called a tool; a named
        # function's call ends with "stop".
        if reason == "stop" and called and self.forced_tool_choice in (None, REQUIRED):
            return "tool_calls"
        return reason

    def chunk_choice(self, c: ChoiceDelta, first: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": self.role} if first else {}
        if self.forced_tool_choice is not None:
            calls = self._forced.setdefault(c.index, ForcedCalls(self.forced_tool_choice)).feed(c.text)
        else:
            calls = list(c.tool_calls)
            text = (self.echo_text or "") + c.text if first else c.text
            if text or not calls:
                delta["content"] = text
        if calls:
            self._called.add(c.index)
            delta["tool_calls"] = [_tool_call_delta(t) for t in calls]
        return {
            "index": c.index,
            "delta": delta,
            "logprobs": self.logprobs(c.logprobs) if c.logprobs is not None else None,
            "finish_reason": self._finish_reason(c.finish_reason, c.index in self._called),
        }

    def full_choice(self, acc: _ChoiceState) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": (self.echo_text or "") + acc.text}
        if self.forced_tool_choice is not None:
            calls = ForcedCalls(self.forced_tool_choice).calls(acc.text)
            message["content"] = ""  # as vLLM answers a forced call
        else:
            calls = list(acc.tool_calls.values())
            if calls and not message["content"]:
                message["content"] = None
        if calls:
            message["tool_calls"] = [
                {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                for t in calls
            ]
        return {
            "index": acc.index,
            "message": message,
            "logprobs": self.logprobs(acc.logprobs) if acc.logprobs is not None else None,
            "finish_reason": self._finish_reason(acc.finish_reason, bool(calls)),
        }


def _tool_call_delta(t: ToolCallDelta) -> dict[str, Any]:
    if t.id is None:
        return {"index": t.index, "function": {"arguments": t.arguments}}
    return {"index": t.index, "id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}


class CompletionShape:
    """Completions' choices. With `echo`, each choice's text starts with its prompt's: `echo_texts` by prompt
    (a batch's choice i * n + j is prompt i's), filled in for token-id prompts once the engine decoded them. With
    `echo_logprobs` (`echo` and `logprobs`), the prompt's tokens head the logprobs too, the first without a
    logprob, and `text_offset` counts from the start of the echoed prompt, as vLLM's server answers."""

    object_full = "text_completion"
    object_chunk = "text_completion"

    def __init__(self, echo_text: str | None = None, n: int = 1, echo_texts: list[str | None] | None = None,
                 echo_logprobs: bool = False):
        self.n = n
        self.echo_texts: list[str | None] = list(echo_texts) if echo_texts is not None else [echo_text]
        self.echo_logprobs = echo_logprobs
        self.prompt_scores: dict[int, list[PromptScore]] = {}  # prompt index -> its tokens, with echo_logprobs
        self._offsets: dict[int, int] = {}  # choice index -> where its next streamed text starts

    @property
    def echo_text(self) -> str | None:
        return self.echo_texts[0] if self.echo_texts else None

    def _echo(self, index: int) -> str:
        prompt = index // self.n
        return (self.echo_texts[prompt] if prompt < len(self.echo_texts) else None) or ""

    @staticmethod
    def logprobs(lps: Sequence[TokenLogprob], offset: int = 0, prompt: Sequence[PromptScore] = ()) -> dict[str, Any]:
        """`prompt`: the echoed prompt's tokens, first; offsets then run from 0 over both (vLLM's)."""
        offsets, pos = [], 0 if prompt else offset
        for token in [p.token for p in prompt] + [lp.token for lp in lps]:
            offsets.append(pos)
            pos += len(token)
        return {
            "tokens": [p.token for p in prompt] + [lp.token for lp in lps],
            "token_logprobs": [p.logprob for p in prompt] + [lp.logprob for lp in lps],
            "top_logprobs": [p.top for p in prompt] + [{t: v for t, v in lp.top} for lp in lps],
            "text_offset": offsets,
        }

    def _scores(self, index: int) -> list[PromptScore]:
        return self.prompt_scores.get(index // self.n, []) if self.echo_logprobs else []

    def chunk_choice(self, c: ChoiceDelta, first: bool) -> dict[str, Any]:
        echo = self._echo(c.index)
        text = echo + c.text if first else c.text
        start = self._offsets.get(c.index, len(echo))  # text_offset counts from the choice's whole text
        self._offsets[c.index] = start + len(c.text)
        shown = self._scores(c.index) if first else []
        return {
            "index": c.index,
            "text": text,
            "logprobs": self.logprobs(c.logprobs, start, shown) if c.logprobs is not None else None,
            "finish_reason": c.finish_reason,
        }

    def full_choice(self, acc: _ChoiceState) -> dict[str, Any]:
        echo = self._echo(acc.index)
        shown = self._scores(acc.index)
        return {
            "index": acc.index,
            "text": echo + acc.text,
            "logprobs": self.logprobs(acc.logprobs, len(echo), shown) if acc.logprobs is not None else None,
            "finish_reason": acc.finish_reason,
        }


class StreamWriter(Protocol):
    """What the route needs of one request's output, whichever API: the events of a stream (payloads; the route
    frames them, app/sse.py) or the one body. `Responder` (chat, completions) and the Responses API's writer
    (app/response_events.py) are the two."""

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


@dataclass(frozen=True)
class PromptScore:
    """One echoed prompt token as completions' logprobs list it: the first has no logprob and no alternatives."""

    token: str
    logprob: float | None
    top: dict[str, float] | None


def _prompt_scores(first: str | None, positions: tuple[tuple[PromptTokenLogprob, ...] | None, ...]
                   ) -> list[PromptScore]:
    scores = []
    for alts in positions:
        if alts is None:  # the first token
            scores.append(PromptScore(first or "", None, None))
        else:  # its own token first, then the others (vllm_engine._prompt_logprobs), all shown as vLLM shows them
            scores.append(PromptScore(alts[0].text, alts[0].logprob, {a.text: a.logprob for a in alts}))
    return scores


def _prompt_logprobs_json(
    positions: tuple[tuple[PromptTokenLogprob, ...] | None, ...],
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's JSON: per prompt position None (the first) or {token id: {logprob, rank, decoded_token}}."""
    return [None if alts is None else {str(a.token_id): {"logprob": a.logprob, "rank": a.rank, "decoded_token": a.text}
                                       for a in alts} for alts in positions]


@dataclass
class _ChoiceState:
    index: int
    text: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop token id or string that ended it
    logprobs: list[TokenLogprob] | None = None
    started: bool = False
    tool_calls: dict[int, ToolCall] = field(default_factory=dict)  # found by the engine's parser, by call index
    token_ids: list[int] = field(default_factory=list)  # with return_token_ids
    prompt_token_ids: list[int] | None = None  # with return_token_ids: its prompt's (a batch has several)
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None  # with prompt_logprobs: its prompt's


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
    # choice (its first chunk); every choice (chunk) has its output's ids.
    return_token_ids: bool = False
    # Prompt tokens the engine found in its prefix cache, over every prompt (usage.prompt_tokens_details).
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        self._choices = [_ChoiceState(i) for i in range(self.n)]

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

    def _absorb(self, c: ChoiceDelta, delta: GenerationDelta | None = None) -> _ChoiceState:
        acc = self._choices[c.index]
        if delta is not None and delta.prompt_token_ids is not None:  # its prompt's, for each choice of that prompt
            for same in self._prompt_group(c.index):  # (a later delta may bring a choice's first output)
                if same.prompt_token_ids is None:
                    same.prompt_token_ids = list(delta.prompt_token_ids)
        if delta is not None and delta.prompt_logprobs is not None and acc.prompt_logprobs is None:
            acc.prompt_logprobs = _prompt_logprobs_json(delta.prompt_logprobs)
            if isinstance(self.shape, CompletionShape) and self.shape.echo_logprobs:  # one prompt's, its n choices'
                self.shape.prompt_scores.setdefault(c.index // self.shape.n,
                                                    _prompt_scores(delta.prompt_first_token, delta.prompt_logprobs))
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

    def _prompt_group(self, index: int) -> list[_ChoiceState]:
        """The choices of choice `index`'s prompt: a completions batch's prompt i has choices i * n .. i * n + n - 1;
        chat has one prompt."""
        if not isinstance(self.shape, CompletionShape):
            return self._choices
        per_prompt = max(1, self.shape.n)
        return self._choices[index // per_prompt * per_prompt:][:per_prompt]

    def usage(self) -> dict[str, Any]:
        completion = sum(c.tokens for c in self._choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            # OpenAI's field (vLLM sends it with --enable-prompt-tokens-details): what the prefix cache saved.
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def _with_token_ids(self, choice: dict[str, Any], acc: _ChoiceState, ids: list[int] | None,
                        first: bool) -> dict[str, Any]:
        if isinstance(self.shape, CompletionShape):
            choice["prompt_token_ids"] = acc.prompt_token_ids if first else None
        choice["token_ids"] = ids
        return choice

    def chunk(self, delta: GenerationDelta) -> dict[str, Any] | None:
        """The stream chunk of `delta`; None when it has nothing to tell (forced tool-call JSON whose next call is
        not yet readable), as vLLM sends no chunk then."""
        self.cached_tokens += delta.cached_tokens or 0
        choices = []
        for c in delta.choices:
            acc = self._absorb(c, delta)
            first = not acc.started
            choice = self.shape.chunk_choice(c, first=first)
            if c.finish_reason is not None:  # vLLM's extension, on the chunk that ends the choice
                choice["stop_reason"] = acc.stop_reason
            acc.started = True
            if self.return_token_ids:
                choice = self._with_token_ids(choice, acc, list(c.token_ids or ()), first)
            elif choice.get("delta") == {} and choice["finish_reason"] is None and choice["logprobs"] is None:
                continue
            choices.append(choice)
        if not choices:
            return None
        out = self._envelope(self.shape.object_chunk)
        if self.return_token_ids and isinstance(self.shape, ChatShape):
            out["prompt_token_ids"] = list(delta.prompt_token_ids) if delta.prompt_token_ids is not None else None
        out["choices"] = choices
        if self.include_usage:
            out["usage"] = self.usage() if self.continuous_usage else None
        return out

    # The stream as the route writes it (the same calls as the Responses API's writer, app/response_events.py).

    def opening(self) -> list[dict[str, Any]]:
        return []

    def events(self, delta: GenerationDelta) -> list[dict[str, Any]]:
        chunk = self.chunk(delta)
        return [chunk] if chunk is not None else []

    def closing(self) -> list[dict[str, Any]]:
        return [self.usage_chunk()] if self.include_usage else []

    def error_events(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return [body]  # the OpenAI error object as one event

    def usage_chunk(self) -> dict[str, Any]:
        out = self._envelope(self.shape.object_chunk)
        out["choices"] = []
        out["usage"] = self.usage()
        return out

    def full(self) -> dict[str, Any]:
        out = self._envelope(self.shape.object_full)
        # vLLM's `stop_reason` on every choice: the stop token id or string that ended it, else null.
        out["choices"] = [{**self.shape.full_choice(c), "stop_reason": c.stop_reason} for c in self._choices]
        if self.return_token_ids:
            out["choices"] = [self._with_token_ids(choice, c, c.token_ids, True)
                              for choice, c in zip(out["choices"], self._choices, strict=True)]
            if isinstance(self.shape, ChatShape):
                out["prompt_token_ids"] = self._choices[0].prompt_token_ids if self._choices else None
        if any(c.prompt_logprobs is not None for c in self._choices):  # asked for (vLLM's shapes)
            if isinstance(self.shape, ChatShape):
                out["prompt_logprobs"] = self._choices[0].prompt_logprobs
            else:  # a prompt's choices share its logprobs (the engine may send them with one of the choices only)
                for choice, c in zip(out["choices"], self._choices, strict=True):
                    choice["prompt_logprobs"] = next(
                        (g.prompt_logprobs for g in self._prompt_group(c.index) if g.prompt_logprobs is not None), None)
        out["usage"] = self.usage()
        return out

    async def collect(self, stream: AsyncGenerator[GenerationDelta, None]) -> dict[str, Any]:
        async for delta in stream:
            self.cached_tokens += delta.cached_tokens or 0
            for c in delta.choices:
                self._absorb(c, delta)
        return self.full()

"""Prompts on their way to the engine: rendered and tokenized on the one tokenizer thread, held to the model's
length contract, and decoded back. No slot is held for any of it (admission comes after).

`PromptTokenizer` refuses, cheapest first: a prompt certainly over the limit from its size alone (no text of
N characters has fewer than N / `engine.max_token_chars` tokens, and a chat template only adds some), then a
tokenizer queue that is full, then a prompt over the limit once counted; `fit_to_context` also checks the
completion's room (shrinking a default `max_tokens` to what is left).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from app.config.model import ModelConfig
from app.engine.interface import Engine, GenerateRequest, GenerationParams, PromptInput
from app.engine.prompt_render import render_prompt, truncated
from app.errors import LONE_SURROGATE, ContextLengthExceeded, InvalidRequest, QueueFull

_T = TypeVar("_T")


_NOT_TEXT = f"it contains {LONE_SURROGATE}"


def _has_lone_surrogate(prompt: PromptInput) -> bool:
    """Whether the prompt's text holds a code point UTF-8 cannot carry: legal JSON, refused by the tokenizer with
    a TypeError about its input types."""
    try:
        json.dumps([prompt.text, prompt.messages, prompt.tools], ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def prompt_param(prompt: PromptInput) -> str:
    """The request parameter a prompt came in: what a 400 about it names."""
    if prompt.param:
        return prompt.param
    return "messages" if prompt.messages is not None else "prompt"


class PromptTokenizer:
    def __init__(self, model: ModelConfig, engine: Engine, refusal: type[QueueFull]):
        self.model = model
        self.engine = engine
        self._refusal = refusal
        # One thread renders prompts: off the event loop (a huge prompt must not stall every stream), and
        # one at a time, because vLLM's tokenizer deep-copies itself for every call that overlaps another
        # (measured: 10% of the replica's CPU under load with the default thread pool).
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tokenize-{model.id}")
        # Tokenizing happens before a request takes an admission slot (a slot must never wait on a tokenizer),
        # so the tokenizer's own queue is bounded apart, as deep as the admission queue.
        dep = model.deployment
        self.waiting = 0
        self.max_waiting = dep.max_ongoing_requests + dep.max_queued_requests

    async def in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def refuse_certainly_too_long(self, prompt: PromptInput, resumed_tokens: int = 0) -> None:
        """A 400 from the prompt's size alone: no text of N characters has fewer than N / max_token_chars
        tokens, and a chat template only adds tokens. Measured before this: a dozen prompts of 1 MB each held
        every admission slot while they waited for the tokenizer, only to fail with 400."""
        limit = self.model.max_prompt_tokens
        if prompt.truncate_to is not None:
            return  # the replica keeps only part of it (`_truncate`)
        if prompt.token_ids is not None:
            at_least, size = len(prompt.token_ids) - resumed_tokens, ""
        else:
            chars = len(prompt.text or "") + sum(len(m.get("content") or "") for m in prompt.messages or ())
            at_least, size = -(-chars // max(1, self.engine.max_token_chars)), f" ({chars} characters)"
        if at_least > limit:
            param = prompt_param(prompt)
            raise ContextLengthExceeded(
                f"The prompt is at least {at_least} tokens{size}; this model accepts at most {limit} prompt "
                f"tokens. Shorten the {param}.",
                param=param,
            )

    async def tokenize(self, prompt: PromptInput) -> list[int]:
        """Renders and tokenizes on the tokenizer thread, refusing when its queue is full."""
        return (await self.tokenize_all((prompt,)))[0]

    async def tokenize_all(self, prompts: tuple[PromptInput, ...]) -> list[list[int]]:
        """Several prompts of one request (an embeddings batch) in one turn of the tokenizer thread: one place in
        its queue, as the request takes one admission slot."""
        if self.waiting >= self.max_waiting:
            raise self._refusal(
                f"The tokenizer has {self.waiting} prompts waiting; retry after the Retry-After delay",
                retry_after_s=1,
            )
        self.waiting += 1
        try:
            return await self.in_thread(lambda: [self._render(p) for p in prompts])
        finally:
            self.waiting -= 1

    def _render(self, prompt: PromptInput) -> list[int]:
        try:
            ids = render_prompt(self.engine, prompt)
        except InvalidRequest:
            raise
        except Exception as err:  # e.g. a chat template that rejects the message order
            why = _NOT_TEXT if _has_lone_surrogate(prompt) else str(err)  # the tokenizer's words say nothing
            raise InvalidRequest(f"the prompt could not be rendered for this model: {why}",
                                 param=prompt_param(prompt)) from None
        if prompt.truncate_to is not None:
            n_ctx = self.model.engine.max_model_len
            if prompt.truncate_to > n_ctx:  # vLLM's refusal, with its message
                raise InvalidRequest(
                    f"truncate_prompt_tokens={prompt.truncate_to} cannot be greater than max_model_len = {n_ctx}. "
                    "Please request a smaller truncation size.",
                    param="truncate_prompt_tokens",
                )
            ids = truncated(ids, prompt.truncate_to, prompt.truncation_side, n_ctx)
        if not ids:
            raise InvalidRequest(
                "the prompt is empty; send at least one token of text",
                param=prompt_param(prompt),
            )
        return ids

    def refuse_dimensions(self, dimensions: int | None) -> None:
        """vLLM's checks of `dimensions` (PoolingParams.verify, with its messages), before any tokenizing."""
        facts = self.engine.embedding_facts
        if dimensions is None or facts is None:
            return
        name = self.model.id
        if not facts.matryoshka:
            raise InvalidRequest(f"Model {name!r} does not support Matryoshka embeddings; dimensions must be unset "
                                 f"(received dimensions={dimensions}).", param="dimensions")
        if not 1 <= dimensions <= facts.size:
            raise InvalidRequest(f"Model {name!r} only supports dimensions in range [1, {facts.size}], "
                                 f"got {dimensions}.", param="dimensions")
        if facts.dimensions is not None and dimensions not in facts.dimensions:
            raise InvalidRequest(f"Model {name!r} only supports Matryoshka dimensions {list(facts.dimensions)}, "
                                 f"got {dimensions}.", param="dimensions")

    def refuse_long_prompt(self, prompt_tokens: int, prompt: PromptInput) -> None:
        max_prompt = self.model.max_prompt_tokens
        if prompt_tokens > max_prompt:
            param = prompt_param(prompt)
            raise ContextLengthExceeded(
                f"The prompt is {prompt_tokens} tokens; this model accepts at most {max_prompt} prompt tokens. "
                f"Shorten the {param}.",
                param=param,
            )

    def fit_to_context(self, prompt_tokens: int, request: GenerateRequest) -> GenerationParams:
        params = request.params
        param = prompt_param(request.prompt)
        self.refuse_long_prompt(prompt_tokens - request.resumed_tokens, request.prompt)
        n_ctx = self.model.engine.max_model_len
        if prompt_tokens + params.max_tokens <= n_ctx:
            return params
        if params.max_tokens_is_default:  # the client did not ask for a length: use what is left
            return replace(params, max_tokens=n_ctx - prompt_tokens)
        raise ContextLengthExceeded(
            f"This model's maximum context length is {n_ctx} tokens. However, you requested "
            f"{prompt_tokens + params.max_tokens} tokens ({prompt_tokens} in the {param}, "
            f"{params.max_tokens} in the completion). "
            f"Please reduce the length of the {param} or completion.",
            param=param,
        )

    def decode_now(self, token_ids: list[int], param: str) -> str:
        try:
            return self.engine.decode(token_ids)
        except Exception as err:  # e.g. an id past the tokenizer's integer type (HF: OverflowError for >= 2**32)
            raise InvalidRequest(
                f"the token ids could not be decoded by this model's tokenizer: {err}", param=param
            ) from None

    async def decode(self, token_ids: list[int], param: str) -> str:
        return await self.in_thread(self.decode_now, token_ids, param)

"""`POST /v1/completions` on the wire: a prompt or a batch of prompts (strings or token ids), converted into the
engine's prompts and `GenerationParams` (with chat's `response_format`, as vLLM takes it here)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field, model_validator

from app.config.model import LimitsConfig
from app.engine.interface import GenerationParams, PromptInput
from app.errors import InvalidRequest, UnsupportedParameter
from app.openai.sampling import (
    SamplingRequest,
)
from app.openai.structured_outputs import ResponseFormat, response_format_params

# A completions batch (vLLM: unbounded): each prompt is an engine request of its own, admitted like any other.
MAX_BATCH_PROMPTS = 32
MAX_BATCH_CHOICES = 64  # prompts x n
# vLLM's refusal of a request without a prompt (its CompletionRequest.validate_prompt_and_prompt_embeds), as its
# server words it: VLLMValidationError's text names the parameter.
NO_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"


class CompletionRequest(SamplingRequest):
    # One prompt (text, or token ids) or a batch of them (texts, or token-id lists), as vLLM takes them.
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: int | None = None  # at least 1, or 0 with `echo` (to_params: vLLM's rule and words)
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    response_format: ResponseFormat | None = None  # vLLM takes chat's here too

    @model_validator(mode="before")
    @classmethod
    def _prompt_given(cls, data: Any) -> Any:
        """vLLM's check, before the prompt's type is: a prompt absent, null or "" is its 400. `prompt_embeds`
        (vLLM's, behind --enable-prompt-embeds) is not served here; null or [] is a no-op, as in vLLM."""
        if not isinstance(data, dict):
            return data
        if data.get("prompt_embeds") not in (None, []):
            raise UnsupportedParameter("'prompt_embeds' is not supported by this service; send 'prompt' (text or "
                                       "token ids)", param="prompt_embeds")
        if data.get("prompt") in (None, ""):
            raise InvalidRequest(NO_PROMPT, param="prompt")
        return {k: v for k, v in data.items() if k != "prompt_embeds"}

    @property
    def _batch(self) -> list[Any]:
        p = self.prompt
        if isinstance(p, str) or all(isinstance(x, int) for x in p):
            return [p]  # one prompt: text, or token ids
        return list(p)

    @property
    def prompt_count(self) -> int:
        return len(self._batch)

    def to_prompts(self, limits: LimitsConfig) -> list[PromptInput]:
        """Every prompt of the request (one, or a batch of up to MAX_BATCH_PROMPTS), in order."""
        batch = self._batch
        if len(batch) > MAX_BATCH_PROMPTS:
            raise InvalidRequest(
                f"'prompt' has {len(batch)} prompts; at most {MAX_BATCH_PROMPTS} are allowed in one request",
                param="prompt",
            )
        if len(batch) * self.n > MAX_BATCH_CHOICES:
            raise InvalidRequest(
                f"{len(batch)} prompts with n={self.n} make {len(batch) * self.n} choices; at most "
                f"{MAX_BATCH_CHOICES} are allowed in one request",
                param="n",
            )
        prompts = []
        for item in batch:
            if isinstance(item, str):
                prompts.append(self._truncating(PromptInput(text=item)))
                continue
            if any(t < 0 for t in item):
                raise InvalidRequest("'prompt' token ids must not be negative", param="prompt")
            prompts.append(self._truncating(PromptInput(token_ids=tuple(item))))
        return prompts

    def to_prompt(self, limits: LimitsConfig) -> PromptInput:
        """The one prompt of a request that has one."""
        prompts = self.to_prompts(limits)
        if len(prompts) != 1:
            raise InvalidRequest("this operation takes one prompt", param="prompt")
        return prompts[0]

    @property
    def echo_texts(self) -> list[str | None]:
        """With `echo`, each prompt's text as far as the request has it (a token-id prompt's comes back from the
        engine with its admission); without, none."""
        return [x if isinstance(x, str) else None for x in self._batch] if self.echo else []

    def to_params(self, limits: LimitsConfig) -> GenerationParams:
        if self.stream and self.use_beam_search:  # vLLM's refusal, in its words (its chat streams the whole answer)
            raise InvalidRequest("Streaming is not currently supported with beam search")
        if self.use_beam_search and self.echo and self.logprobs is not None:
            raise InvalidRequest("`echo` with `logprobs` is not supported with beam search because beam search does "
                                 "not compute prompt logprobs.", param="echo")
        if self.max_tokens is not None and self.max_tokens < 1 and not self.echo_only:
            raise InvalidRequest(f"max_tokens must be at least 1, got {self.max_tokens}.", param="max_tokens")
        if self.echo_only and self.logprob_token_ids:
            raise InvalidRequest("`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because "
                                 "no output tokens are generated.", param="logprob_token_ids")
        max_tokens = 1 if self.echo_only else self.max_tokens  # vLLM's: one token, generated and not shown
        params = self._params(limits, max_tokens, "max_tokens", logprobs=self.logprobs, logprobs_name="logprobs",
                              **response_format_params(self.response_format, self.structured_outputs))
        if self.echo_logprobs and self.prompt_logprobs is None:
            # vLLM's: `echo` with `logprobs` scores the echoed prompt too, with as many alternatives (streamed too).
            params = replace(params, prompt_logprobs=self.logprobs)
        if self.echo and self.stream:  # vLLM's: each choice's first chunk carries its prompt's ids, asked or not
            params = replace(params, return_token_ids=True)
        return params

    @property
    def echo_only(self) -> bool:
        """vLLM's `echo` with `max_tokens` 0: each choice is its prompt alone."""
        return self.echo and self.max_tokens == 0

    @property
    def echo_logprobs(self) -> bool:
        """The echoed prompt's tokens head each choice's logprobs (vLLM's `echo` with `logprobs`)."""
        return self.echo and self.logprobs is not None


CompletionRequest.model_rebuild()

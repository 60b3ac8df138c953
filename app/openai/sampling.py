"""What chat and completions requests share: the sampling parameters (OpenAI's and vLLM's extensions), their
bounds, and their conversion against the model's `LimitsConfig` into the engine's `GenerationParams`, raising
`InvalidRequest` that names the parameter. Parameters the service does not implement are refused by name rather
than silently ignored."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from app.config.model import LimitsConfig
from app.engine.interface import GenerationParams, PromptInput
from app.errors import InvalidRequest, UnsupportedParameter
from app.openai.json_depth import BoundedBody
from app.openai.sampling_bounds import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_LOGPROB_TOKEN_IDS,
    MAX_REQUEST_ID_CHARS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOKEN_ID,
    MAX_TOP_K,
    bad_words,
    cache_salt,
    logit_bias,
    text_only,
    token_ids,
)
from app.openai.structured_outputs import StructuredOutputs
from app.openai.unserved_fields import refuse_unserved

TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


class SamplingRequest(BoundedBody):
    # Unknown fields are collected, then refused by name in `_refuse_unknown` (app/openai/unserved_fields.py).
    model_config = ConfigDict(extra="allow")

    model: str | None = None  # as vLLM: left out (or ""), the served model (app/http/ingress_state.py)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # vLLM's: a torch int64
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI's cache hint: a routing hint as X-Session-Id is (which wins when both are sent).
    prompt_cache_key: str | None = None
    session_id: str | None = Field(None, description="vLLM extension: the conversation's id, a routing hint too.")
    cache_salt: str | None = Field(None, description="vLLM extension: prefix-cache blocks shared only with it.")
    ignore_eos: bool = Field(False, description="vLLM extension: keep generating past end-of-sequence (benchmarks).")
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS, description=(
        "vLLM extension: the answer's id after its prefix (`chatcmpl-`, `cmpl-`); an X-Request-Id header wins."))
    add_special_tokens: bool | None = Field(None, description="vLLM extension: only its default (SPECIAL_TOKENS).")
    # vLLM's sampling and decoding extensions (the openai SDK sends them through `extra_body`), with vLLM's types
    # and defaults; see docs/api.md.
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K, description="vLLM extension: 0 or -1 for every token.")
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM extension.")
    min_tokens: int = Field(0, ge=0, description="vLLM extension: no end-of-sequence or stop token id before this.")
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False, description="vLLM extension.")
    stop_token_ids: list[TokenId] | None = Field(None, description="vLLM extension.")
    include_stop_str_in_output: bool = Field(False, description="vLLM extension.")
    skip_special_tokens: bool = Field(True, description="vLLM extension.")
    spaces_between_special_tokens: bool = Field(True, description="vLLM extension.")
    logit_bias: dict[str, Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        None, description="Token id (as a string) to a bias added to its logit, clamped to [-100, 100]."
    )
    allowed_token_ids: list[TokenId] | None = Field(None, description="vLLM extension: sample only these tokens.")
    bad_words: list[str] = Field(default_factory=list, description="vLLM extension: words never generated.")
    return_token_ids: bool | None = Field(None, description="vLLM extension: the prompt's and the output's ids.")
    return_tokens_as_token_ids: bool | None = Field(
        None, description="vLLM extension: logprobs name each token 'token_id:<id>' instead of its text."
    )
    prompt_logprobs: int | None = Field(
        None, description="vLLM extension: the prompt's tokens' logprobs, with this many alternatives (not streamed)."
    )
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, le=2**63 - 1, description="vLLM extension: keep only this many prompt tokens (-1: the context)."
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="vLLM extension: 'left' (default) keeps the last tokens, 'right' the first."
    )
    priority: int = Field(0, ge=-(2**63), le=2**63 - 1, description="vLLM extension: the engine's scheduling "
                                                                    "priority (lower first); fcfs ignores it.")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM extension: one constraint (json, regex, choice, grammar or json_object)."
    )
    logprob_token_ids: list[TokenId] | None = Field(
        None, description="vLLM extension: at each step the logprobs of these ids (and the chosen one's), with "
                          "logprobs asked for."
    )
    use_beam_search: bool = Field(False, description="vLLM extension: beam search, `n` beams wide, answered whole.")
    length_penalty: float = Field(1.0, allow_inf_nan=False, description="vLLM extension: beam search's.")
    # vLLM's words when `logprob_token_ids` comes without logprobs (chat's `logprobs` is a flag, completions' a count).
    LOGPROBS_NEEDED: ClassVar[str] = "`logprobs` must be set."
    SPECIAL_TOKENS: ClassVar[bool] = True  # vLLM's add_special_tokens default: completions' (chat's is false)

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        # vLLM's server takes null for these as "the default" (its fields are Optional); so does this one.
        return cls.model_fields[str(info.field_name)].default if value is None else value

    @model_validator(mode="after")
    def _refuse_unknown(self) -> SamplingRequest:
        refuse_unserved(self.model_extra or {})
        if self.add_special_tokens not in (None, self.SPECIAL_TOKENS):
            raise UnsupportedParameter(
                f"'add_special_tokens: {str(self.add_special_tokens).lower()}' is not supported: the prompt is "
                f"tokenized {'with' if self.SPECIAL_TOKENS else 'as the chat template renders it, without'} the "
                "tokenizer's special tokens (vLLM's default); leave it out", param="add_special_tokens")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("'stream_options' is only allowed when 'stream' is true", param="stream_options")
        return self

    def _truncating(self, prompt: PromptInput) -> PromptInput:
        """The prompt with vLLM's truncation asked for, which the replica applies once it has the token ids."""
        if self.truncate_prompt_tokens is None:
            return prompt
        return replace(prompt, truncate_to=self.truncate_prompt_tokens, truncation_side=self.truncation_side or "left")

    def _stop_sequences(self, limits: LimitsConfig) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > limits.max_stop_sequences:
            raise InvalidRequest(
                f"'stop' has {len(stops)} sequences; at most {limits.max_stop_sequences} are allowed", param="stop"
            )
        for s in stops:
            if not s:
                raise InvalidRequest("'stop' sequences must not be empty", param="stop")
            if len(s) > limits.max_stop_sequence_chars:
                raise InvalidRequest(
                    f"a 'stop' sequence is {len(s)} characters; at most {limits.max_stop_sequence_chars} are allowed",
                    param="stop",
                )
        text_only("stop", stops)
        return tuple(stops)

    def _extensions(self, max_tokens: int) -> dict[str, Any]:
        """vLLM's sampling extensions as `GenerationParams` fields, checked as vLLM checks them (`min_tokens`
        against the `max_tokens` in effect) and against this service's bounds; ids beyond the model's vocabulary
        are the engine's to refuse (it knows the vocabulary)."""
        if self.min_tokens > max_tokens:
            raise InvalidRequest(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {self.min_tokens}",
                param="min_tokens",
            )
        allowed = token_ids("allowed_token_ids", self.allowed_token_ids, MAX_ALLOWED_TOKEN_IDS)
        if allowed is not None and not allowed:
            raise InvalidRequest("allowed_token_ids is not None and empty!", param="allowed_token_ids")
        repetition_penalty = 1.0 if self.repetition_penalty is None else self.repetition_penalty
        if not math.isfinite(repetition_penalty):  # pydantic refuses NaN and infinities; a model built in code too
            raise InvalidRequest("repetition_penalty must be a finite number", param="repetition_penalty")
        return {
            "top_k": self.top_k or 0,
            "min_p": self.min_p or 0.0,
            "min_tokens": self.min_tokens,
            "repetition_penalty": repetition_penalty,
            "stop_token_ids": tuple(  # repeats dropped, as vLLM's SamplingParams drops them
                dict.fromkeys(token_ids("stop_token_ids", self.stop_token_ids, MAX_STOP_TOKEN_IDS) or ())
            ),
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "logit_bias": logit_bias(self.logit_bias),
            "allowed_token_ids": allowed,
            "bad_words": bad_words(self.bad_words),
            "return_token_ids": bool(self.return_token_ids),
            "tokens_as_ids": bool(self.return_tokens_as_token_ids),
            "cache_salt": cache_salt(self.cache_salt),
            "prompt_logprobs": self.prompt_logprobs,
            "priority": self.priority,
        }

    def _params(
        self,
        limits: LimitsConfig,
        max_tokens: int | None,
        max_tokens_name: str,
        logprobs: int | None,
        logprobs_name: str,
        **extra: Any,
    ) -> GenerationParams:
        is_default = max_tokens is None
        if max_tokens is None:
            # vLLM's default is whatever the context has left, so a min_tokens above our default raises it
            # (up to limits.max_tokens; beyond that min_tokens itself is refused).
            max_tokens = max(limits.default_max_tokens, min(self.min_tokens, limits.max_tokens))
        elif max_tokens > limits.max_tokens:
            raise InvalidRequest(
                f"'{max_tokens_name}' is {max_tokens}; this model allows at most {limits.max_tokens}",
                param=max_tokens_name,
            )
        if self.n > limits.max_n:
            raise InvalidRequest(f"'n' is {self.n}; this model allows at most {limits.max_n}", param="n")
        if self.n > 1 and self.temperature == 0 and not self.use_beam_search:  # beams are n searches, not samples
            raise InvalidRequest(
                "'n' > 1 needs sampling; with temperature 0 every choice would be the same. "
                "Raise 'temperature' or set n to 1",
                param="n",
            )
        chosen_ids = self._logprob_token_ids(logprobs)
        if chosen_ids is not None:
            logprobs = len(chosen_ids)  # every one listed, as vLLM lists them (the chosen token's first)
        elif logprobs is not None and logprobs > limits.max_logprobs:
            raise InvalidRequest(
                f"'{logprobs_name}' is {logprobs}; this model allows at most {limits.max_logprobs}", param=logprobs_name
            )
        constraint = self.structured_outputs.params() if self.structured_outputs is not None else {}
        self._check_prompt_logprobs(limits)
        return GenerationParams(
            max_tokens=max_tokens,
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self._stop_sequences(limits),
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=logprobs,
            ignore_eos=self.ignore_eos,
            max_tokens_is_default=is_default,
            logprob_token_ids=chosen_ids,
            beam_search=self.use_beam_search,
            length_penalty=self.length_penalty,
            **self._extensions(max_tokens),
            **{**constraint, **extra},  # chat's response_format and forced tool calls replace the constraint
        )

    def _logprob_token_ids(self, logprobs: int | None) -> tuple[int, ...] | None:
        """vLLM's `logprob_token_ids`, with its rules and words: logprobs asked for, no beam search, at most
        MAX_LOGPROB_TOKEN_IDS; an empty list is none. Ids beyond the vocabulary are the engine's to refuse."""
        ids = self.logprob_token_ids
        if not ids:
            return None
        if self.use_beam_search:
            raise InvalidRequest("`logprob_token_ids` is not supported with beam search.", param="logprob_token_ids")
        if logprobs is None:
            raise InvalidRequest(f"when using `logprob_token_ids`, {self.LOGPROBS_NEEDED}", param="logprob_token_ids")
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            raise InvalidRequest(f"Requested logprob_token_ids of length {len(ids)}, which is greater than max "
                                 f"allowed: {MAX_LOGPROB_TOKEN_IDS}", param="logprob_token_ids")
        return tuple(ids)

    def _check_prompt_logprobs(self, limits: LimitsConfig) -> None:
        """vLLM's rules (its messages): not with a stream unless 0, at least 0 or -1 (the whole vocabulary, which
        no model here allows: the most is `limits.max_logprobs`, as for `logprobs`)."""
        k = self.prompt_logprobs
        if k is None:
            return
        if self.stream and (k > 0 or k == -1):
            raise InvalidRequest("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        if k < 0 and k != -1:
            raise InvalidRequest("`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
        if k == -1 or k > limits.max_logprobs:
            raise InvalidRequest(
                f"'prompt_logprobs' is {k}; this model allows at most {limits.max_logprobs}", param="prompt_logprobs"
            )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's `continuous_usage_stats`: usage on every chunk; only together with `include_usage`, as in vLLM."""
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM extension
    include_obfuscation: Literal[False] | None = None  # OpenAI's padding against length side channels: none here


SamplingRequest.model_rebuild()

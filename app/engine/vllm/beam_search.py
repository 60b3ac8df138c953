"""Beam search as `vllm serve` runs it: vLLM's own online beam search (`BeamSearchOnlineMixin`), which asks the
engine for one token per beam and step, with 2 x `n` logprobs, keeps the `n` best, and answers with every beam
whole at the end (one `RequestOutput`, its `n` outputs ranked by `length_penalty`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from vllm import RequestOutput
from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin
from vllm.inputs import tokens_input
from vllm.sampling_params import BeamSearchParams
from vllm.v1.engine.async_llm import AsyncLLM

from app.engine.interface import GenerationParams


class _Beams(BeamSearchOnlineMixin):
    """The mixin over one engine: it needs only the engine client and its renderer (for the tokenizer)."""

    def __init__(self, llm: AsyncLLM):
        self.engine_client = llm
        self.renderer = llm.renderer


def beam_search_outputs(
    llm: AsyncLLM, prompt_token_ids: list[int], request_id: str, p: GenerationParams
) -> AsyncGenerator[RequestOutput, None]:
    """vLLM's beam search for `p` (its chat and completions servers' `to_beam_search_params`: `n` beams; stop
    strings, top-p and penalties do not apply to it there either)."""
    params = BeamSearchParams(
        beam_width=p.n,
        max_tokens=p.max_tokens,
        ignore_eos=p.ignore_eos,
        temperature=p.temperature,
        length_penalty=p.length_penalty,
        include_stop_str_in_output=p.include_stop_str_in_output,
        skip_special_tokens=p.skip_special_tokens,
    )
    return _Beams(llm).beam_search(tokens_input(list(prompt_token_ids), cache_salt=p.cache_salt), request_id, params)

"""Neutral requests into vLLM's types: the engine's arguments from the model's config, and `GenerationParams`
as vLLM's `SamplingParams`."""

from __future__ import annotations

from typing import Any

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from app.config.model import ModelConfig
from app.engine.cpu.precision import Dtype
from app.engine.interface import (
    GenerationParams,
)
from app.engine.kv_sizing import kv_cache_shortfall
from app.engine.model_store import resolve_source
from app.engine.vllm import output_resume
from app.engine.vllm.generator_resume import DRAWS_KEY
from app.engine.vllm.output_resume import RESUMED_KEY
from app.errors import ServiceUnavailable


def computes_in_process(model: ModelConfig) -> bool:
    """On the CPU with one worker the EngineCore computes itself (vLLM's `UniProcExecutor`). vLLM's CPU platform
    would turn "uni" into its multiprocessing executor, whose worker process imports vLLM once more at every
    start: 6-8 s of a 14-17 s engine start, at the same tokens/s (docs/autoscaling.md). Passed as the class, it
    stays; its OpenMP placement comes from cpu/openmp.py's `openmp_env`."""
    return not model.on_gpu and model.engine.tensor_parallel_size == 1


def engine_args(model: ModelConfig, dtype: Dtype) -> AsyncEngineArgs:
    """vLLM's arguments for `model`; `dtype` is `engine.dtype` as resolved for this machine (cpu/precision.py)."""
    e = model.engine
    # An embedding model: vLLM's pooling runner, converting a causal LM into an embedding model (its pooler: the
    # last token's hidden state, L2-normalized), as `vllm serve --runner pooling --convert embed`.
    extra: dict[str, Any] = {"runner": "pooling", "convert": "embed"} if model.runner == "embed" else {}
    folder = resolve_source(model.source)
    if computes_in_process(model):
        extra["distributed_executor_backend"] = UniProcExecutor
    if e.kv_cache_gib and not model.on_gpu:  # in bytes: VLLM_CPU_KVCACHE_SPACE takes whole GiB only
        extra["kv_cache_memory_bytes"] = int(e.kv_cache_gib * 2**30)
        if short := kv_cache_shortfall(folder, dtype, e.kv_cache_gib, e.max_model_len):  # before vLLM loads anything
            raise ValueError(f"model '{model.id}': {short}")
    return AsyncEngineArgs(
        **extra,
        model=folder,
        served_model_name=model.id,
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        dtype=dtype,
        enforce_eager=e.enforce_eager,
        seed=e.seed,
        scheduling_policy=e.scheduling_policy or "fcfs",  # unset outside a deployment (rayserve/builder.py)
        gpu_memory_utilization=e.gpu_memory_utilization,
        tensor_parallel_size=e.tensor_parallel_size,
        trust_remote_code=e.trust_remote_code,
        # Beam search asks for 2 x n logprobs at each of its steps (vLLM's BeamSearchOnlineMixin).
        max_logprobs=max(model.limits.max_logprobs, 2 * model.limits.max_n, 1),
    )


def _extra_args(p: GenerationParams) -> dict[str, int] | None:
    """What this service's vLLM plugins read off a continued choice: its generator's draws, its output so far."""
    extra = {key: value for key, value in ((DRAWS_KEY, p.generator_draws), (RESUMED_KEY, p.resumed_output)) if value}
    return extra or None


def sampling_params(p: GenerationParams) -> SamplingParams:
    structured = None
    if p.json_schema is not None:
        structured = StructuredOutputsParams(json=p.json_schema)
    elif p.json_object:
        structured = StructuredOutputsParams(json_object=True)
    elif p.regex is not None:
        structured = StructuredOutputsParams(regex=p.regex)
    elif p.choice is not None:
        structured = StructuredOutputsParams(choice=list(p.choice))
    elif p.grammar is not None:
        structured = StructuredOutputsParams(grammar=p.grammar)
    if structured is not None and p.resumed_output and not output_resume.active():
        raise ServiceUnavailable("this replica's vLLM cannot resume a structured output's grammar (its plugin is "
                                 "not loaded): send the request again", retry_after_s=1)
    return SamplingParams(
        n=p.n,
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        stop=list(p.stop) or None,
        seed=p.seed,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        logprobs=None if p.logprob_token_ids else p.logprobs,  # vLLM's: the ids' logprobs in place of the top ones
        logprob_token_ids=list(p.logprob_token_ids) if p.logprob_token_ids else None,
        ignore_eos=p.ignore_eos,
        structured_outputs=structured,
        output_kind=RequestOutputKind.DELTA,
        top_k=p.top_k,
        min_p=p.min_p,
        min_tokens=p.min_tokens,
        repetition_penalty=p.repetition_penalty,
        stop_token_ids=list(p.stop_token_ids),
        include_stop_str_in_output=p.include_stop_str_in_output,
        skip_special_tokens=p.skip_special_tokens,
        spaces_between_special_tokens=p.spaces_between_special_tokens,
        logit_bias=dict(p.logit_bias) or None,
        allowed_token_ids=list(p.allowed_token_ids) if p.allowed_token_ids is not None else None,
        bad_words=list(p.bad_words) or None,
        prompt_logprobs=p.prompt_logprobs,
        extra_args=_extra_args(p),
    )


def engine_prompt(prompt_token_ids: list[int], p: GenerationParams) -> TokensPrompt:
    """The prompt as vLLM takes it: its token ids, and the request's cache_salt where it has one."""
    prompt = TokensPrompt(prompt_token_ids=list(prompt_token_ids))
    if p.cache_salt:
        prompt["cache_salt"] = p.cache_salt
    return prompt

"""A continued choice's output so far counts as output in the engine: penalties, bad words and grammar resume.

A continuation (app/engine/continuation.py) of a choice that has generated k tokens is a new request whose prompt
ends in those k tokens. vLLM counts `presence_penalty` and `frequency_penalty` and matches `bad_words` over a
request's output only, and compiles a structured output's grammar afresh, so on the next replica the k tokens would
be prompt: the penalties would forget them, a bad word begun before the cut could be finished after it, and the
grammar would start its JSON again inside the JSON already sent. This vLLM general plugin (entry point
`vllm.general_plugins`, loaded in the replica and in the EngineCore) reads `app_resumed_output: k` from a request's
`SamplingParams.extra_args` and gives vLLM's own code the output the first replica had:

- the sampler sees the request's output as the prompt's last k ids followed by its own (`GPUModelRunner._sample`),
  so vLLM's penalties and bad-words matching count them exactly as the first replica did (the repetition penalty
  already counts prompt and output alike);
- the grammar, once compiled, accepts the k ids before the first step (`StructuredOutputManager._create_grammar`),
  so its state is the first replica's at the cut.

Where vLLM's layout differs, `register` patches nothing and `active()` stays False: the replica then refuses to
continue a structured output (a retryable 503, as before this plugin) rather than answer with a grammar restarted.
The grammar is the scheduler's, on any device. The sampler's part patches vLLM's V1 model runner, the one the CPU
engine runs; on a GPU with Triton, vLLM 0.32 runs its Model Runner V2 instead (`VLLM_USE_V2_MODEL_RUNNER=0` keeps
V1), where a continuation's penalties and bad words count the tokens after the cut only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

RESUMED_KEY = "app_resumed_output"
_PATCHED = "_app_resumes_output"
_active = False


def active() -> bool:
    """The plugin has patched this process's vLLM (a replica's process stands for its EngineCore: one install)."""
    return _active


def prior_output(prompt_token_ids: list[int] | None, sampling_params: Any) -> list[int]:
    """The ids of a continued request's prompt that are its choice's output so far (none for other requests)."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    k = int(extra.get(RESUMED_KEY, 0))
    if k <= 0 or not prompt_token_ids:
        return []
    return list(prompt_token_ids[-k:])


def extended_outputs(req_ids: list[str], outputs: list[list[int]], requests: dict[str, Any]
                     ) -> list[list[int]] | None:
    """Each batch row's output as the sampler should count it (a continued request's prior output first), or None
    when no row is a continuation (the batch's own lists stand)."""
    extended: list[list[int]] = []
    resumed = False
    for i, out in enumerate(outputs):
        state = requests.get(req_ids[i]) if i < len(req_ids) else None
        prior = prior_output(state.prompt_token_ids, state.sampling_params) if state is not None else []
        if prior and out is not None:
            extended.append([*prior, *out])
            resumed = True
        else:
            extended.append(out)
    return extended if resumed else None


def with_prior_output(sample: Callable[..., Any]) -> Callable[..., Any]:
    """The model runner's `_sample`, its sampling metadata's output ids extended for continued requests."""

    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        batch = self.input_batch
        metadata = batch.sampling_metadata
        if not metadata.output_token_ids:  # no penalty or bad word in the batch reads them
            return sample(self, logits, spec_decode_metadata)
        fill = getattr(batch, "update_async_output_token_ids", None)
        if fill is not None:
            fill()  # the last step's placeholders (async scheduling) filled in before the lists are copied
        extended = extended_outputs(batch.req_ids, metadata.output_token_ids, self.requests)
        if extended is None:
            return sample(self, logits, spec_decode_metadata)
        batch.sampling_metadata = dataclasses.replace(metadata, output_token_ids=extended)
        try:
            return sample(self, logits, spec_decode_metadata)
        finally:
            batch.sampling_metadata = metadata

    setattr(_sample, _PATCHED, True)
    return _sample


def with_grammar_resumed(create: Callable[..., Any]) -> Callable[..., Any]:
    """The structured-output manager's `_create_grammar`, the grammar advanced by a continued request's output."""

    def _create_grammar(self: Any, request: Any) -> Any:
        grammar = create(self, request)
        prior = prior_output(request.prompt_token_ids, request.sampling_params)
        if prior and not grammar.accept_tokens(request.request_id, prior):
            raise ValueError(f"the grammar does not accept the {len(prior)} tokens this request resumes")
        return grammar

    setattr(_create_grammar, _PATCHED, True)
    return _create_grammar


def register() -> None:
    """vLLM's plugin hook (pyproject's `vllm.general_plugins`)."""
    global _active
    try:
        from vllm.v1.structured_output import StructuredOutputManager
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception:  # another vLLM layout: continuations of structured outputs stay refused
        return
    if not (callable(getattr(GPUModelRunner, "_sample", None))
            and callable(getattr(StructuredOutputManager, "_create_grammar", None))):
        return
    if not getattr(GPUModelRunner._sample, _PATCHED, False):
        GPUModelRunner._sample = with_prior_output(GPUModelRunner._sample)
    if not getattr(StructuredOutputManager._create_grammar, _PATCHED, False):
        StructuredOutputManager._create_grammar = with_grammar_resumed(StructuredOutputManager._create_grammar)
    _active = True

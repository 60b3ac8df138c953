"""A seeded sampled choice continued on another replica samples what it would have: its generator resumed.

vLLM seeds a request's generator from its `seed` when the request arrives, and on a CPU (x86 and Arm) draws one
value from it per step to sample the step's token (`TopKTopPSampler.forward_cpu`: `torch.randint(0, 2**31, (1,),
generator=...)`). A continuation (app/engine/continuation.py) of a choice that has generated k tokens is a new
request with the same seed, so it would draw the first value again: a different sample from the one the choice
would have made. This vLLM general plugin (entry point `vllm.general_plugins`, which vLLM loads in its engine and
worker processes) advances the generator of a request whose `SamplingParams.extra_args` carry
`app_generator_draws: k` by k draws before its first step. Elsewhere (a GPU samples with per-vocabulary noise, or
a vLLM whose model runner differs) it does nothing, and the continuation is a fresh sample of the same
distribution, as docs/api.md says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
DRAWS_KEY = "app_generator_draws"
_PATCHED = "_app_resumes_generators"


def advance(generator: Any, draws: int) -> None:
    """`generator` as after `draws` steps of vLLM's CPU sampler (one 31-bit draw each)."""
    import torch

    if draws > 0:
        torch.randint(0, 2**31, (draws,), generator=generator)


def resuming(update_states: Callable[..., Any]) -> Callable[..., Any]:
    """The model runner's `_update_states`, then each new request's generator advanced as its params ask."""

    def _update_states(self: Any, scheduler_output: Any) -> Any:
        result = update_states(self, scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            draws = int((params.extra_args or {}).get(DRAWS_KEY, 0)) if params is not None else 0
            state = self.requests.get(new.req_id)
            if draws and state is not None and state.generator is not None:
                advance(state.generator, draws)
        return result

    setattr(_update_states, _PATCHED, True)
    return _update_states


def register() -> None:
    """vLLM's plugin hook (pyproject's `vllm.general_plugins`)."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception:  # another vLLM layout: continuations stay fresh samples
        return
    if not current_platform.is_cpu() or getattr(GPUModelRunner._update_states, _PATCHED, False):
        return
    GPUModelRunner._update_states = resuming(GPUModelRunner._update_states)

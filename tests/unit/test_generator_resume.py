"""A seeded sampled choice continued on another replica resumes its generator (app/engine/vllm/generator_resume.py):
advanced by the draws vLLM's CPU sampler made for the tokens already generated, it draws next exactly what the
first replica's would have."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from app.engine.interface import GenerationParams
from app.engine.vllm.generator_resume import DRAWS_KEY, advance, resuming
from app.engine.vllm.to_vllm import sampling_params


def _one_step(generator: torch.Generator) -> int:
    return int(torch.randint(0, 2**31, (1,), generator=generator).item())  # vLLM 0.32's forward_cpu, per step


def test_a_generator_advanced_by_k_draws_is_the_one_after_k_steps():
    first, resumed = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    steps = [_one_step(first) for _ in range(40)]
    advance(resumed, 25)
    assert [_one_step(resumed) for _ in range(15)] == steps[25:]


def test_the_model_runner_advances_only_the_new_requests_that_ask():
    asked, plain = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    runner = SimpleNamespace(requests={"a": SimpleNamespace(generator=asked), "b": SimpleNamespace(generator=plain),
                                       "c": SimpleNamespace(generator=None)})
    new = [SimpleNamespace(req_id="a", sampling_params=SimpleNamespace(extra_args={DRAWS_KEY: 4})),
           SimpleNamespace(req_id="b", sampling_params=SimpleNamespace(extra_args=None)),
           SimpleNamespace(req_id="c", sampling_params=SimpleNamespace(extra_args={DRAWS_KEY: 4}))]
    calls = []
    update = resuming(lambda self, out: calls.append(out) or "done")
    assert update(runner, SimpleNamespace(scheduled_new_reqs=new)) == "done" and len(calls) == 1
    assert _one_step(plain) == _one_step(torch.Generator().manual_seed(3))  # not asked: untouched
    reference = torch.Generator().manual_seed(3)
    for _ in range(4):
        _one_step(reference)
    assert _one_step(asked) == _one_step(reference)


def test_the_draws_reach_vllm_in_the_request_s_extra_args():
    assert sampling_params(GenerationParams(max_tokens=4, seed=1, generator_draws=9)).extra_args == {DRAWS_KEY: 9}
    assert not sampling_params(GenerationParams(max_tokens=4, seed=1)).extra_args


def test_a_continuation_of_a_seeded_sampled_choice_asks_for_its_draws():
    from app.engine.continuation import Continuation
    from app.engine.interface import Admitted, ChoiceDelta, GenerationDelta
    from tests.support.fake_stack import make_request

    progress = Continuation(make_request("hi", max_tokens=9, n=2, temperature=0.7, seed=4))
    progress.observe(Admitted(3))
    progress.observe(GenerationDelta((ChoiceDelta(1, "ab", 2, token_ids=(5, 6)),), prompt_token_ids=(1, 2, 3)))
    resumed = progress.resume(1, timeout_s=5).params
    assert (resumed.seed, resumed.generator_draws) == (5, 2)
    greedy = Continuation(make_request("hi", max_tokens=9, temperature=0, seed=4))
    assert greedy.resume(0, timeout_s=5).params.generator_draws == 0

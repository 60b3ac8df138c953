"""A continued choice's output so far counts as output in the engine (app/engine/vllm/output_resume.py): the sampler
counts it for penalties and bad words, the grammar accepts it before the first step, and a replica whose vLLM
lacks the plugin refuses to continue a structured output rather than restart its grammar."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from app.engine.interface import GenerationParams
from app.engine.vllm import output_resume
from app.engine.vllm.generator_resume import DRAWS_KEY
from app.engine.vllm.output_resume import (
    RESUMED_KEY,
    extended_outputs,
    prior_output,
    with_grammar_resumed,
    with_prior_output,
)
from app.engine.vllm.to_vllm import sampling_params
from app.errors import ServiceUnavailable


def _state(prompt: list[int], resumed: int = 0) -> SimpleNamespace:
    extra = {RESUMED_KEY: resumed} if resumed else None
    return SimpleNamespace(prompt_token_ids=prompt, sampling_params=SimpleNamespace(extra_args=extra))


def test_the_prior_output_is_the_prompt_s_last_resumed_ids():
    assert prior_output([1, 2, 3, 4, 5], SimpleNamespace(extra_args={RESUMED_KEY: 2})) == [4, 5]
    assert prior_output([1, 2, 3], SimpleNamespace(extra_args=None)) == []
    assert prior_output([1, 2, 3], SimpleNamespace(extra_args={DRAWS_KEY: 4})) == []
    assert prior_output(None, SimpleNamespace(extra_args={RESUMED_KEY: 2})) == []


def test_only_continued_rows_get_their_prior_output_in_front():
    requests = {"plain": _state([1, 2, 3]), "resumed": _state([1, 2, 3, 40, 41], resumed=2)}
    plain_out, resumed_out = [7], [42, 43]
    extended = extended_outputs(["plain", "resumed"], [plain_out, resumed_out], requests)
    assert extended == [[7], [40, 41, 42, 43]]
    assert extended[0] is plain_out  # rows not continued keep the batch's own list (vLLM fills it in place)
    assert extended_outputs(["plain"], [plain_out], requests) is None


@dataclass
class _Metadata:
    output_token_ids: list[list[int]]
    no_penalties: bool = False


@dataclass
class _Batch:
    req_ids: list[str]
    sampling_metadata: _Metadata
    updates: list[int] = field(default_factory=list)

    def update_async_output_token_ids(self) -> None:
        self.updates.append(1)


def test_the_sampler_sees_a_continued_request_s_whole_output_and_the_batch_keeps_its_own():
    metadata = _Metadata(output_token_ids=[[7], [42]])
    runner = SimpleNamespace(input_batch=_Batch(["plain", "resumed"], metadata),
                             requests={"plain": _state([1]), "resumed": _state([1, 2, 40, 41], resumed=2)})
    seen = []
    sample = with_prior_output(lambda self, logits, spec: seen.append(self.input_batch.sampling_metadata) or "out")
    assert sample(runner, "logits", None) == "out"
    assert seen[0].output_token_ids == [[7], [40, 41, 42]]
    assert runner.input_batch.sampling_metadata is metadata and metadata.output_token_ids == [[7], [42]]
    assert runner.input_batch.updates  # async placeholders are filled in before the lists are copied


def test_a_batch_without_penalties_or_continuations_is_sampled_untouched():
    for metadata, requests in ((_Metadata(output_token_ids=[]), {"r": _state([1, 2], resumed=1)}),
                               (_Metadata(output_token_ids=[[3]]), {"r": _state([1, 2])})):
        runner = SimpleNamespace(input_batch=_Batch(["r"], metadata), requests=requests)
        sample = with_prior_output(lambda self, logits, spec: self.input_batch.sampling_metadata)
        assert sample(runner, 0, None) is metadata


class _Grammar:
    def __init__(self, accepts: bool = True):
        self.accepted: list[int] = []
        self.accepts = accepts

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        self.accepted.extend(tokens)
        return self.accepts


def test_the_grammar_accepts_the_resumed_output_before_its_first_step():
    grammar = _Grammar()
    create = with_grammar_resumed(lambda self, request: grammar)
    request = SimpleNamespace(request_id="r", **vars(_state([1, 2, 30, 31, 32], resumed=3)))
    assert create(None, request) is grammar and grammar.accepted == [30, 31, 32]
    fresh = _Grammar()
    with_grammar_resumed(lambda self, request: fresh)(None, SimpleNamespace(request_id="f", **vars(_state([1]))))
    assert fresh.accepted == []


def test_a_grammar_that_refuses_the_resumed_output_fails_the_request():
    create = with_grammar_resumed(lambda self, request: _Grammar(accepts=False))
    with pytest.raises(ValueError, match="does not accept the 1 tokens"):
        create(None, SimpleNamespace(request_id="r", **vars(_state([1, 2], resumed=1))))


def test_the_plugin_patches_the_pinned_vllm():
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    output_resume.register()
    output_resume.register()  # idempotent: vLLM loads plugins in several places of one process
    assert output_resume.active()
    assert getattr(GPUModelRunner._sample, "_app_resumes_output", False)
    assert getattr(StructuredOutputManager._create_grammar, "_app_resumes_output", False)


def test_the_resumed_output_reaches_vllm_in_the_request_s_extra_args(monkeypatch):
    monkeypatch.setattr(output_resume, "_active", True)
    params = sampling_params(GenerationParams(max_tokens=4, seed=1, temperature=0.5, generator_draws=3,
                                              resumed_output=3, json_object=True))
    assert params.extra_args == {DRAWS_KEY: 3, RESUMED_KEY: 3}
    assert not sampling_params(GenerationParams(max_tokens=4)).extra_args


def test_without_the_plugin_a_structured_output_is_not_continued_with_its_grammar_restarted(monkeypatch):
    monkeypatch.setattr(output_resume, "_active", False)
    with pytest.raises(ServiceUnavailable, match="cannot resume a structured output"):
        sampling_params(GenerationParams(max_tokens=4, json_schema={"type": "object"}, resumed_output=2))
    assert sampling_params(GenerationParams(max_tokens=4, presence_penalty=1.0, resumed_output=2)).extra_args == {
        RESUMED_KEY: 2}  # penalties without the plugin: counted over the new output only, as before

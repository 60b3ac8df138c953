"""Differential, at the parameter level: the same request body through vLLM's own OpenAI request models
(`vllm.entrypoints.openai...protocol`, `to_sampling_params`, as `vllm serve` builds them) and through this
service's (`to_params`, then `VLLMEngine`'s `sampling_params`) must be refused by both or give the same
`SamplingParams`, field by field. Property-generated bodies over the sampling parameters and vLLM's extensions,
valid and not, inside this service's documented bounds (docs/api.md lists where it deliberately differs: those are
tested on their own at the end). No engine: the vocabulary checks are the engine's and are not compared here."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion
from vllm.exceptions import VLLMValidationError

from app.config.model import LimitsConfig
from app.engine.vllm.to_vllm import sampling_params
from app.errors import InvalidRequest
from app.openai.chat import ChatCompletionRequest
from app.openai.completions import CompletionRequest

LIMITS = LimitsConfig(max_tokens=64, default_max_tokens=16, max_n=4, max_stop_sequences=4)
COMPARED = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "bad_words",
            "include_stop_str_in_output", "ignore_eos", "max_tokens", "min_tokens", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "skip_special_tokens", "spaces_between_special_tokens",
            "logit_bias", "allowed_token_ids")
SETTINGS = dict(max_examples=400, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

_ids = st.lists(st.integers(0, 2000), max_size=5)
_bad_ids = st.one_of(st.lists(st.integers(-5, -1), min_size=1, max_size=2), st.just(["x"]), st.just(3))
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.one_of(st.none(), st.floats(0, 2), st.sampled_from([0, 0.005, 2.5, -1])),
    "top_p": st.one_of(st.none(), st.floats(0.01, 1), st.sampled_from([0, 1.5])),
    "n": st.integers(0, 3),
    "seed": st.one_of(st.none(), st.integers(-5, 10**6)),
    "stop": st.one_of(st.none(), st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=3),
                      st.just([""])),
    "presence_penalty": st.one_of(st.none(), st.floats(-2, 2), st.just(2.5)),
    "frequency_penalty": st.one_of(st.none(), st.floats(-2, 2), st.just(-3)),
    "ignore_eos": st.booleans(),
    "max_tokens": st.one_of(st.none(), st.integers(0, 64)),
    "top_k": st.one_of(st.none(), st.integers(-3, 1000), st.just(2.0), st.just(2.5), st.just("k")),
    "min_p": st.one_of(st.none(), st.floats(0, 1), st.sampled_from([-0.5, 1.5])),
    "min_tokens": st.one_of(st.integers(0, 70), st.just(-1), st.just(None)),
    "repetition_penalty": st.one_of(st.none(), st.floats(0.01, 3), st.sampled_from([0, -1, 1e6])),
    "stop_token_ids": st.one_of(st.none(), _ids, _bad_ids),
    "include_stop_str_in_output": st.one_of(st.booleans(), st.just(None)),
    "skip_special_tokens": st.booleans(),
    "spaces_between_special_tokens": st.booleans(),
    "logit_bias": st.one_of(
        st.none(),
        st.dictionaries(st.integers(0, 2000).map(str), st.floats(-300, 300), max_size=4),
        st.dictionaries(st.sampled_from([" 7", "07", "1_0", "x", "", "1.5"]), st.floats(-5, 5), min_size=1,
                        max_size=2)),
    "allowed_token_ids": st.one_of(st.none(), _ids, _bad_ids),
    "bad_words": st.one_of(st.lists(st.text(min_size=1, max_size=6), max_size=3), st.just([""]), st.just(None)),
}


@st.composite
def bodies(draw) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=7, unique=True))
    return {name: draw(FIELDS[name]) for name in names}


def vllm_params(kind: str, body: dict[str, Any], max_tokens: int):
    """What `vllm serve` makes of `body` (None: a refusal), given the `max_tokens` its server settles on."""
    try:
        if kind == "chat":
            request: Any = VllmChat(model="m", messages=[{"role": "user", "content": "hi"}], **body)
        else:
            request = VllmCompletion(model="m", prompt="hi", **body)
        sp = request.to_sampling_params(max_tokens, {})
    except (ValidationError, VLLMValidationError, ValueError, TypeError):
        return None
    # What vLLM's engine then refuses before any output (SamplingParams.verify), short of the vocabulary's size:
    # an empty allowed_token_ids, negative ids.
    if sp.allowed_token_ids is not None and not sp.allowed_token_ids:
        return None
    if any(t < 0 for t in [*(sp.allowed_token_ids or ()), *sp.stop_token_ids, *(sp.logit_bias or {})]):
        return None
    return sp


def our_params(kind: str, body: dict[str, Any]):
    try:
        if kind == "chat":
            request: Any = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **body)
        else:
            request = CompletionRequest(model="m", prompt="hi", **body)
        params = request.to_params(LIMITS)
    except (ValidationError, InvalidRequest):
        return None, None
    try:
        return params, sampling_params(params)  # vLLM's own checks run here, as the engine would run them
    except (VLLMValidationError, ValueError, TypeError):
        return params, None


def _same(a: Any, b: Any) -> bool:
    if a in (None, {}) and b in (None, {}):  # no logit_bias: None here, {} in vLLM's from_optional
        return True
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_same_sampling_params_as_vllm_serve_builds(kind):
    seen = {"both refused": 0, "same params": 0}

    @settings(**SETTINGS)
    @given(body=bodies())
    def check(body):
        ours, ours_sp = our_params(kind, body)
        # vLLM's server resolves an absent max_tokens to what the context leaves; ours to its default (raised
        # to min_tokens). Compared at the max_tokens this service settled on, or as the client sent it.
        sent = body.get("max_tokens")
        max_tokens = ours.max_tokens if ours is not None else (LIMITS.max_tokens if sent is None else sent)
        theirs = vllm_params(kind, body, max_tokens)
        if theirs is None or ours_sp is None:
            assert theirs is None and ours_sp is None, f"only one refused {body}: vLLM {theirs}, ours {ours_sp}"
            seen["both refused"] += 1
            return
        for name in COMPARED:
            assert _same(getattr(ours_sp, name), getattr(theirs, name)), (
                name, getattr(ours_sp, name), getattr(theirs, name), body)
        seen["same params"] += 1

    check()
    assert seen["both refused"] > 20 and seen["same params"] > 100, seen


# -- the deliberate differences (docs/api.md) ------------------------------------------------------------------


def test_deliberate_differences_from_vllm():
    hi = [{"role": "user", "content": "hi"}]
    # bounded here, unbounded in vLLM
    for body in ({"logit_bias": {str(i): 1 for i in range(1025)}}, {"allowed_token_ids": list(range(4097))},
                 {"stop_token_ids": list(range(65))}, {"bad_words": [f"w{i}" for i in range(129)]},
                 {"bad_words": ["w" * 257]}, {"top_k": 2**31}):
        assert vllm_params("chat", body, 16) is not None, body
        with pytest.raises((InvalidRequest, ValidationError)):
            ChatCompletionRequest(model="m", messages=hi, **body).to_params(LIMITS)
    # a NaN bias: vLLM clamps it to -100, here it is a 400
    assert vllm_params("chat", {"logit_bias": {"5": math.nan}}, 16).logit_bias == {5: -100.0}
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", messages=hi, logit_bias={"5": math.nan})
    # without max_tokens, vLLM's default is the rest of the context; here limits.default_max_tokens (16),
    # raised to min_tokens
    assert ChatCompletionRequest(model="m", messages=hi, min_tokens=40).to_params(LIMITS).max_tokens == 40

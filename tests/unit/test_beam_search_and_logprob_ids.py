"""vLLM's `use_beam_search` (with `length_penalty`) and `logprob_token_ids` on chat and completions: the request
models against vLLM's own (`to_sampling_params`, `to_beam_search_params` and their refusals, in vLLM's words), the
engine's arguments (beam search's 2 x n logprobs a step), and the answers through the in-process stack on the fake
engine. The real engine against bare `vllm serve`: the differential cases (loadkit/differential/cases.py)."""

from __future__ import annotations

from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion
from vllm.exceptions import VLLMValidationError

from app.config.model import LimitsConfig, ModelConfig
from app.engine.vllm.to_vllm import engine_args, sampling_params
from app.errors import InvalidRequest
from app.openai.chat import ChatCompletionRequest
from app.openai.completions import CompletionRequest
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MODEL_ID, chat_body

LIMITS = LimitsConfig(max_tokens=64, default_max_tokens=16, max_n=4)
HI = [{"role": "user", "content": "hi"}]


def _ours(kind: str, body: dict[str, Any]):
    if kind == "chat":
        return ChatCompletionRequest(model="m", messages=HI, **body).to_params(LIMITS)
    return CompletionRequest(model="m", prompt="hi", **body).to_params(LIMITS)


def _vllms(kind: str, body: dict[str, Any]):
    return (VllmChat(model="m", messages=HI, **body) if kind == "chat"
            else VllmCompletion(model="m", prompt="hi", **body))


@pytest.mark.parametrize("kind, body", [
    ("chat", {"logprobs": True, "logprob_token_ids": [5, 9, 11]}),
    ("chat", {"logprobs": True, "top_logprobs": 2, "logprob_token_ids": [5]}),
    ("chat", {"logprobs": True, "logprob_token_ids": []}),
    ("completion", {"logprobs": 0, "logprob_token_ids": [5, 9]}),
    ("completion", {"logprobs": 3, "logprob_token_ids": [7]}),
])
def test_logprob_token_ids_reach_the_engine_as_vllm_s_server_sends_them(kind, body):
    theirs = _vllms(kind, body).to_sampling_params(16, {})
    ours = sampling_params(_ours(kind, {**body, "max_tokens": 16}))
    assert (ours.logprobs, ours.logprob_token_ids) == (theirs.logprobs, theirs.logprob_token_ids)


@pytest.mark.parametrize("kind, body", [
    ("chat", {"logprob_token_ids": [5]}),
    ("chat", {"logprobs": True, "logprob_token_ids": [5], "use_beam_search": True}),
    ("completion", {"logprob_token_ids": [5]}),
    ("completion", {"logprobs": 1, "logprob_token_ids": [5], "use_beam_search": True}),
    ("completion", {"logprobs": 1, "echo": True, "use_beam_search": True}),
])
def test_refusals_are_vllm_s_in_its_words(kind, body):
    with pytest.raises(VLLMValidationError) as theirs:
        _vllms(kind, body)
    with pytest.raises(InvalidRequest) as ours:
        _ours(kind, body)
    assert str(theirs.value).startswith(ours.value.message), (str(theirs.value), ours.value.message)
    assert ours.value.param in str(theirs.value)


def test_more_named_ids_than_vllm_takes_is_refused_in_its_words():
    with pytest.raises(InvalidRequest, match="Requested logprob_token_ids of length 129, which is greater than max "
                                             "allowed: 128") as err:
        _ours("chat", {"logprobs": True, "logprob_token_ids": list(range(129))})
    assert err.value.param == "logprob_token_ids"


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_beam_search_is_n_beams_as_vllm_s_server_makes_them(kind):
    body = {"use_beam_search": True, "n": 3, "temperature": 0, "length_penalty": 0.5, "max_tokens": 10,
            "ignore_eos": True}
    theirs = _vllms(kind, body).to_beam_search_params(10, {})
    ours = _ours(kind, body)
    assert ours.beam_search
    assert (ours.n, ours.max_tokens, ours.temperature, ours.length_penalty, ours.ignore_eos) == (
        theirs.beam_width, theirs.max_tokens, theirs.temperature, theirs.length_penalty, theirs.ignore_eos)


def test_n_above_one_at_temperature_zero_is_refused_unless_it_is_beams():
    with pytest.raises(InvalidRequest):
        _ours("chat", {"n": 2, "temperature": 0})
    assert _ours("chat", {"n": 2, "temperature": 0, "use_beam_search": True}).n == 2


def test_the_engine_allows_the_logprobs_a_beam_search_step_asks_for():
    model = ModelConfig.model_validate({"id": "m", "limits": {"max_n": 8, "max_logprobs": 5}})
    assert engine_args(model, "float32").max_logprobs == 16


async def test_a_chat_answer_lists_the_named_ids_logprobs_after_the_chosen_one(client):
    r = await client.post("/v1/chat/completions", json=chat_body(logprobs=True, logprob_token_ids=[72, 105],
                                                                 max_tokens=3))
    assert r.status_code == 200, r.text
    for token in r.json()["choices"][0]["logprobs"]["content"]:
        assert [t["token"] for t in token["top_logprobs"]] == [token["token"], "H", "i"]


async def test_completions_list_the_named_ids_logprobs_after_the_chosen_one(client):
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2, "logprobs": 0,
                                                   "logprob_token_ids": [72]})
    assert r.status_code == 200, r.text
    logprobs = r.json()["choices"][0]["logprobs"]
    assert [list(top)[1:] for top in logprobs["top_logprobs"]] == [["H"], ["H"]]


async def test_beam_search_answers_n_beams_at_temperature_zero(client):
    r = await client.post("/v1/chat/completions", json=chat_body(use_beam_search=True, n=3, temperature=0,
                                                                 max_tokens=5))
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["message"]["content"] for c in choices}) == 3  # beams, not one answer thrice


@pytest.mark.parametrize("path, body, message, param", [
    ("/v1/completions", {"model": MODEL_ID, "prompt": "Hi", "use_beam_search": True, "stream": True},
     "Streaming is not currently supported with beam search", None),
    ("/v1/chat/completions/batch", {"model": MODEL_ID, "messages": [HI, HI], "use_beam_search": True},
     "Batch chat completions do not support beam search. Please set `use_beam_search` to False.",
     "use_beam_search"),
    ("/v1/chat/completions", chat_body(logprob_token_ids=[5]),
     "when using `logprob_token_ids`, `logprobs` must be set to true.", "logprob_token_ids"),
])
async def test_what_vllm_refuses_is_a_400_in_its_words(client, path, body, message, param):
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert_error_shape(r.status_code, r.headers.get("content-type", ""), r.content)
    assert (r.json()["error"]["message"], r.json()["error"]["param"]) == (message, param)

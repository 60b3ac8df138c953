"""vLLM's completions `echo` with `max_tokens` 0: the prompt alone, one token generated (and counted in usage) but
not shown; without `echo`, `max_tokens` below 1 is vLLM's 400 in its words. The request model against vLLM's own
(`to_sampling_params` and its refusal), the answers through the in-process stack on the fake engine. The real
engine against bare `vllm serve`: the differential cases (loadkit/differential/cases.py)."""

from __future__ import annotations

import pytest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion
from vllm.exceptions import VLLMValidationError

from app.config.model import LimitsConfig
from app.engine.vllm.to_vllm import sampling_params
from app.errors import InvalidRequest
from app.openai.completions import CompletionRequest
from tests.support import sse
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MODEL_ID

LIMITS = LimitsConfig(max_tokens=64, default_max_tokens=16)
PROMPT = "Q, a"


@pytest.mark.parametrize("body", [{"echo": True, "max_tokens": 0}, {"echo": True, "max_tokens": 0, "logprobs": 2}])
def test_echo_without_generation_asks_the_engine_what_vllm_s_server_asks(body):
    theirs = VllmCompletion(model="m", prompt=PROMPT, **body).to_sampling_params(0, {})
    ours = sampling_params(CompletionRequest(model="m", prompt=PROMPT, **body).to_params(LIMITS))
    assert (ours.max_tokens, ours.logprobs, ours.prompt_logprobs) == (
        theirs.max_tokens, theirs.logprobs, theirs.prompt_logprobs)


@pytest.mark.parametrize("body", [{"max_tokens": 0}, {"max_tokens": -1}, {"max_tokens": -1, "echo": True}])
def test_max_tokens_below_one_without_echo_only_is_vllm_s_400(body):
    with pytest.raises(InvalidRequest) as err:
        CompletionRequest(model="m", prompt=PROMPT, **body).to_params(LIMITS)
    assert (str(err.value), err.value.param) == (f"max_tokens must be at least 1, got {body['max_tokens']}.",
                                                 "max_tokens")


def test_logprob_token_ids_with_echo_only_is_vllm_s_refusal_in_its_words():
    body = {"echo": True, "max_tokens": 0, "logprobs": 1, "logprob_token_ids": [5]}
    with pytest.raises(VLLMValidationError) as theirs:
        VllmCompletion(model="m", prompt=PROMPT, **body)
    with pytest.raises(InvalidRequest) as ours:
        CompletionRequest(model="m", prompt=PROMPT, **body).to_params(LIMITS)
    assert str(ours.value) == str(theirs.value).split(" (parameter=")[0]
    assert ours.value.param == "logprob_token_ids"


async def test_echo_with_max_tokens_0_answers_the_prompt_alone(client):
    body = {"model": MODEL_ID, "prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 1}
    answer = (await client.post("/v1/completions", json=body)).json()
    (choice,) = answer["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert "".join(choice["logprobs"]["tokens"]) == PROMPT  # the prompt's tokens only
    assert answer["usage"]["completion_tokens"] == 1  # the token generated, counted as vLLM counts it
    streamed = sse.parse((await client.post("/v1/completions", json={**body, "stream": True})).text)
    chunks = [c for c in streamed if isinstance(c, dict)]
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPT
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_max_tokens_0_without_echo_is_a_400_naming_it(client):
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 0})
    assert r.status_code == 400
    err = assert_error_shape(r.status_code, r.headers["content-type"], r.content)
    assert err["param"] == "max_tokens" and "at least 1" in err["message"]

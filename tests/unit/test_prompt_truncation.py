"""vLLM's truncate_prompt_tokens / truncation_side and priority on chat and completions (docs/api.md): the replica
keeps the last (or first) N prompt tokens after rendering, `-1` is the context less one token, a size over the
context is vLLM's 400; a prompt over the limits that truncation brings within them is served. `priority` is
accepted and reaches the engine (vLLM's fcfs scheduler ignores it)."""

from __future__ import annotations

import pytest

from app.engine.interface import PromptInput
from app.openai.chat import ChatCompletionRequest
from app.openai.completions import CompletionRequest
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MAX_MODEL_LEN, MODEL_ID, chat_body, make_config


async def _usage(client, path: str, body: dict) -> dict:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


async def test_a_completion_prompt_is_cut_to_its_last_tokens(client):
    body = {"model": MODEL_ID, "prompt": list(range(1, 41)), "max_tokens": 2}
    assert (await _usage(client, "/v1/completions", body))["prompt_tokens"] == 40
    cut = await _usage(client, "/v1/completions", {**body, "truncate_prompt_tokens": 10})
    assert cut["prompt_tokens"] == 10
    right = await _usage(client, "/v1/completions", {**body, "truncate_prompt_tokens": 10, "truncation_side": "right"})
    assert right["prompt_tokens"] == 10
    short = await _usage(client, "/v1/completions", {**body, "truncate_prompt_tokens": 100})
    assert short["prompt_tokens"] == 40  # nothing to cut


async def test_a_chat_prompt_over_the_context_is_served_once_truncated(client):
    long = "z" * (MAX_MODEL_LEN * 2)  # the fake tokenizer: one token per byte
    r = await client.post("/v1/chat/completions", json=chat_body(long, max_tokens=2))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    # -1: the context less one token, which the default max_tokens then shrinks to (as in vLLM).
    usage = await _usage(client, "/v1/chat/completions", chat_body(long, truncate_prompt_tokens=-1))
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (MAX_MODEL_LEN - 1, 1)
    usage = await _usage(client, "/v1/chat/completions", chat_body(long, max_tokens=2, truncate_prompt_tokens=100))
    assert usage["prompt_tokens"] == 100


@pytest.mark.parametrize("value", [MAX_MODEL_LEN + 1, -2, "ten"], ids=["over-the-context", "below-minus-one",
                                                                      "not-a-number"])
async def test_a_bad_truncation_is_a_400_naming_it(client, value):
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2,
                                                   "truncate_prompt_tokens": value})
    assert r.status_code == 400, r.text
    error = assert_error_shape(r.status_code, r.headers.get("content-type", ""), r.content)
    assert error["param"] == "truncate_prompt_tokens", error


async def test_a_bad_truncation_side_is_a_400_naming_it(client):
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2,
                                                   "truncate_prompt_tokens": 2, "truncation_side": "middle"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncation_side", r.text


def test_the_request_models_carry_truncation_and_priority_to_the_engine():
    limits = make_config().models[0].limits
    chat = ChatCompletionRequest.model_validate(chat_body(truncate_prompt_tokens=5, priority=-3))
    prompt = chat.to_prompt(limits)
    assert (prompt.truncate_to, prompt.truncation_side) == (5, "left")
    completion = CompletionRequest.model_validate({"model": MODEL_ID, "prompt": ["a", "b"], "priority": 7,
                                                   "truncate_prompt_tokens": 1, "truncation_side": "right"})
    assert [p.truncation_side for p in completion.to_prompts(limits)] == ["right", "right"]
    assert PromptInput(text="x").truncate_to is None
    assert completion.to_params(limits).priority == 7 and chat.to_params(limits).priority == -3


async def test_priority_is_accepted_on_both_endpoints(client):
    assert (await client.post("/v1/chat/completions", json=chat_body(max_tokens=2, priority=5))).status_code == 200
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2,
                                                   "priority": -1})
    assert r.status_code == 200, r.text
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "priority": 2**64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"

"""Issue 26: answers shaped as `vllm serve` (0.32) shapes them, through the in-process stack (fake engine).

- `usage.prompt_tokens_details` is null unless `service.enable_prompt_tokens_details` (vLLM's
  --enable-prompt-tokens-details) turns it on; a stream's usage leaves it out then, as vLLM leaves nulls out.
  The Responses API's usage always has `input_tokens_details.cached_tokens`, as vLLM's does.
- A completions request without a prompt gets vLLM's message.
- A value out of range gets vLLM's wording of pydantic's error (`less_than_equal`, its bound), with this service's
  error shape and `param`.
(`return_token_ids`: test_return_token_ids.py; `echo` with `continue_final_message`: test_chat_template_options.py.)
"""

from __future__ import annotations

import pytest

from app.config.common import ConfigError
from app.errors import InvalidRequest
from app.openai import validation_errors
from app.openai.completions import CompletionRequest
from tests.support import sse
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MODEL_ID, chat_body, make_config

PROMPT = "a prompt long enough to span several blocks of the prefix cache, sent twice"
STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True}}


def _usage_chunk(text: str) -> dict:
    return next(e["usage"] for e in sse.parse(text) if isinstance(e, dict) and e.get("usage"))


def _body(path: str, **extra) -> dict:
    if path == "/v1/chat/completions":
        return chat_body(PROMPT, max_tokens=2, **extra)
    return {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 2, **extra}


# -- usage.prompt_tokens_details ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_prompt_tokens_details_is_null_by_default(client, path):
    for _ in range(2):  # the second finds the prompt in the prefix cache: still not reported
        usage = (await client.post(path, json=_body(path))).json()["usage"]
        assert "prompt_tokens_details" in usage and usage["prompt_tokens_details"] is None, usage
    streamed = _usage_chunk((await client.post(path, json=_body(path, **STREAM_USAGE))).text)
    assert "prompt_tokens_details" not in streamed and streamed["prompt_tokens"] == usage["prompt_tokens"]
    continuous = await client.post(path, json=_body(path, stream=True, stream_options={
        "include_usage": True, "continuous_usage_stats": True}))
    per_chunk = [e["usage"] for e in sse.parse(continuous.text) if isinstance(e, dict) and e.get("choices")]
    assert per_chunk and not any("prompt_tokens_details" in u for u in per_chunk)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_prompt_tokens_details_when_turned_on(make_stack, path):
    client = make_stack(config=make_config(service={"enable_prompt_tokens_details": True})).client
    first = (await client.post(path, json=_body(path))).json()["usage"]
    again = (await client.post(path, json=_body(path))).json()["usage"]
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < again["prompt_tokens"]
    streamed = _usage_chunk((await client.post(path, json=_body(path, **STREAM_USAGE))).text)
    if path == "/v1/completions":  # vLLM's completions say the cached tokens only
        assert first["prompt_tokens_details"] == {"cached_tokens": 0}
        assert streamed["prompt_tokens_details"] == {"cached_tokens": cached}
        return
    # vLLM's chat also says the tokens the request wrote into the cache: its whole blocks, less those found there
    held = first["prompt_tokens"] // 16 * 16
    assert first["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": held}
    assert again["prompt_tokens_details"] == {"cached_tokens": cached, "created_cache_tokens": held - cached}
    assert streamed["prompt_tokens_details"] == {"cached_tokens": cached, "created_cache_tokens": held - cached}


async def test_the_responses_api_always_reports_cached_tokens(client):
    body = {"model": MODEL_ID, "input": PROMPT, "max_output_tokens": 2}
    await client.post("/v1/responses", json=body)
    usage = (await client.post("/v1/responses", json=body)).json()["usage"]
    assert 0 < usage["input_tokens_details"]["cached_tokens"] < usage["input_tokens"]  # as vLLM's, flag or not


def test_the_setting_lives_in_service_and_a_misspelling_is_refused():
    assert make_config().service.enable_prompt_tokens_details is False
    assert make_config(service={"enable_prompt_tokens_details": True}).service.enable_prompt_tokens_details
    with pytest.raises(ConfigError, match="enable_prompt_token_details"):
        make_config(service={"enable_prompt_token_details": True})


# -- a completions request without a prompt -------------------------------------------------------------------

@pytest.mark.parametrize("prompt", ["absent", None, ""], ids=["absent", "null", "empty"])
async def test_no_prompt_is_vllms_400(client, prompt):
    body = {"model": MODEL_ID, "max_tokens": 2}
    if prompt != "absent":
        body["prompt"] = prompt
    r = await client.post("/v1/completions", json=body)
    error = assert_error_shape(r.status_code, r.headers.get("content-type"), r.content)
    assert r.status_code == 400 and error["param"] == "prompt" and error["type"] == "invalid_request_error"
    # vLLM 0.32's text as its server sends it (VLLMValidationError names its parameter)
    assert error["message"] == "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"


async def test_prompt_embeds_are_refused_by_name_unless_a_no_op(client):
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt_embeds": "AAAA", "max_tokens": 2})
    error = assert_error_shape(r.status_code, r.headers.get("content-type"), r.content)
    assert (r.status_code, error["param"], error["code"]) == (400, "prompt_embeds", "unsupported_parameter")
    for no_op in (None, []):
        r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "prompt_embeds": no_op,
                                                        "max_tokens": 2})
        assert r.status_code == 200, r.text


def test_the_check_runs_before_the_prompts_type():
    with pytest.raises(InvalidRequest) as refused:
        CompletionRequest.model_validate({"model": MODEL_ID, "prompt": None})
    assert refused.value.param == "prompt"


# -- out-of-range values: vLLM's wording, the service's shape --------------------------------------------------

async def _refused(client, path: str, **fields) -> dict:
    body = {"model": MODEL_ID, "max_tokens": 2, **fields}
    body.update({"prompt": "Hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]})
    r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    return assert_error_shape(r.status_code, r.headers.get("content-type"), r.content)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_64_bit_seed_overflow_names_the_constraint_as_vllm_does(client, path):
    over = await _refused(client, path, seed=2**63)
    # vLLM 0.32's message for the same request, character for character
    assert over["message"] == (
        "1 validation error:\n  {'type': 'less_than_equal', 'loc': 'body.seed', 'msg': 'Input should be less than or "
        "equal to 9223372036854775807', 'input': '9223372036854775808', 'ctx': {'le': 9223372036854775807}}")
    assert (over["param"], over["type"], over["code"]) == ("seed", "invalid_request_error", None)
    under = await _refused(client, path, seed=-(2**63) - 1)
    assert "'type': 'greater_than_equal'" in under["message"] and under["param"] == "seed"
    for edge in (2**63 - 1, -(2**63)):  # vLLM's bounds, both taken
        ok = await client.post(path, json={**_body(path), "seed": edge, "temperature": 0.5})
        assert ok.status_code == 200, ok.text


async def test_other_bounds_are_worded_the_same_way(client):
    error = await _refused(client, "/v1/chat/completions", temperature=2.5)
    assert error["message"].startswith("1 validation error:\n  {'type': 'less_than_equal', 'loc': 'body.temperature'")
    assert error["param"] == "temperature"
    error = await _refused(client, "/v1/chat/completions", top_p=0)
    assert "'type': 'greater_than'" in error["message"] and error["param"] == "top_p"


async def test_the_message_is_bounded_however_large_the_input(client):
    r = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": [[1], "x" * 5000] + [{}] * 50})
    error = assert_error_shape(r.status_code, r.headers.get("content-type"), r.content)
    assert r.status_code == 400 and error["param"] == "prompt"
    assert len(error["message"]) <= 12_000 and "x" * 300 not in error["message"]


def test_locations_drop_pydantics_union_branches():
    assert validation_errors.location(("body", "prompt", "list[str]", 0)) == "body.prompt.0"
    assert validation_errors.location(("body", "stop", "str")) == "body.stop"
    errors = [{"type": "int_parsing", "loc": ("body", "seed"), "msg": "m", "input": "x"}] * 12
    text = validation_errors.message(errors)
    assert text.startswith("12 validation errors:\n") and text.endswith("...and 2 more errors")
    assert validation_errors.param(errors) == "seed" and validation_errors.message([]) == "Validation error"

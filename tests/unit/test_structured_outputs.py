"""vLLM's `structured_outputs` on chat and completions (app/openai/structured_outputs.py): exactly one constraint, each
bounded; it becomes the engine's constraint; `response_format` replaces a JSON one and conflicts with any other;
forced tool calls and it are vLLM's 400; the engine's refusal to compile one names `structured_outputs`. The
real engine's output under each kind: tests/integration/test_sampling_extensions.py."""

from __future__ import annotations

import pytest
from vllm.sampling_params import StructuredOutputsParams

from app.engine.interface import GenerationParams
from app.engine.vllm import refusals, to_vllm
from app.openai.chat import ChatCompletionRequest
from app.openai.completions import CompletionRequest
from app.openai.structured_outputs import MAX_CHOICES, MAX_REGEX_CHARS
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MODEL_ID, chat_body, make_config

LIMITS = make_config().models[0].limits


@pytest.mark.parametrize("constraint, field, value", [
    ({"json": {"type": "object"}}, "json_schema", {"type": "object"}),
    ({"json": '{"type": "string"}'}, "json_schema", {"type": "string"}),
    ({"regex": "[0-9]+"}, "regex", "[0-9]+"),
    ({"choice": ["yes", "no"]}, "choice", ("yes", "no")),
    ({"grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
    ({"json_object": True}, "json_object", True),
], ids=["json", "json-text", "regex", "choice", "grammar", "json_object"])
def test_each_kind_becomes_the_engine_s_constraint(constraint, field, value):
    for body in (chat_body(structured_outputs=constraint),
                 {"model": MODEL_ID, "prompt": "Hi", "structured_outputs": constraint}):
        model = ChatCompletionRequest if "messages" in body else CompletionRequest
        params = model.model_validate(body).to_params(LIMITS)
        assert getattr(params, field) == value
        assert params.json_schema_param == "structured_outputs"
    sampling = to_vllm.sampling_params(params).structured_outputs
    assert isinstance(sampling, StructuredOutputsParams)
    assert getattr(sampling, "json" if field == "json_schema" else field) == (list(value) if field == "choice"
                                                                             else value)


@pytest.mark.parametrize("constraint", [
    {}, {"regex": "a", "choice": ["b"]}, {"json": {"type": "object"}, "json_object": True},
    {"regex": "a" * (MAX_REGEX_CHARS + 1)}, {"choice": [str(i) for i in range(MAX_CHOICES + 1)]}, {"choice": []},
    {"json": "not json"}, {"json": "[1, 2]"}, {"regex": "a", "whitespace_pattern": " "}, {"grammar": ""},
], ids=["none", "two", "json-and-object", "long-regex", "many-choices", "no-choice", "bad-json-text",
        "json-text-not-an-object", "an-option-not-taken", "empty-grammar"])
async def test_a_bad_constraint_is_a_400_naming_structured_outputs(client, constraint):
    r = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2, structured_outputs=constraint))
    assert r.status_code == 400, r.text
    error = assert_error_shape(r.status_code, r.headers.get("content-type", ""), r.content)
    assert error["param"] is not None and error["param"].startswith("structured_outputs"), error


@pytest.mark.parametrize("model, body", [(ChatCompletionRequest, chat_body()),
                                         (CompletionRequest, {"model": MODEL_ID, "prompt": "Hi"})],
                         ids=["chat", "completions"])  # vLLM takes chat's response_format on completions too
def test_response_format_replaces_a_json_constraint_and_conflicts_with_any_other(model, body):
    fmt = {"type": "json_object"}
    params = model.model_validate({**body, "response_format": fmt, "structured_outputs": {"json": {"type": "string"}}}
                                  ).to_params(LIMITS)
    assert params.json_object and params.json_schema is None and params.json_schema_param == "response_format"
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    params = model.model_validate({**body, "response_format": schema}).to_params(LIMITS)
    assert params.json_schema == {"type": "object"} and not params.json_object
    assert model.model_validate({**body, "response_format": {"type": "text"}}).to_params(LIMITS).json_schema is None
    with pytest.raises(Exception, match="one kind"):
        model.model_validate({**body, "response_format": fmt, "structured_outputs": {"regex": "a"}}).to_params(LIMITS)


async def test_completions_take_response_format_and_refuse_a_malformed_one_naming_it(client):
    body = {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 8, "response_format": {"type": "json_object"}}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    r = await client.post("/v1/completions", json={**body, "response_format": {"type": "json_schema"}})
    assert r.status_code == 400
    assert assert_error_shape(r.status_code, r.headers["content-type"], r.content)["param"] == "response_format"


def test_forced_tool_calls_and_a_constraint_are_vllm_s_400():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    request = ChatCompletionRequest.model_validate(
        chat_body(tools=[tool], tool_choice="required", structured_outputs={"regex": "a"}))
    with pytest.raises(Exception, match="structured outputs or tools") as raised:
        request.to_params(LIMITS)
    assert raised.value.param == "structured_outputs"


async def test_the_fake_engine_answers_within_the_constraint(client):
    r = await client.post("/v1/chat/completions", json=chat_body(max_tokens=4,
                                                                 structured_outputs={"choice": ["yes", "no"]}))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "yes", r.text


def test_an_engine_refusal_of_a_constraint_names_structured_outputs():
    refused = refusals.refusal(ValueError("grammar could not be compiled"),
                                   GenerationParams(max_tokens=2, grammar="root ::= x",
                                                    json_schema_param="structured_outputs"))
    assert getattr(refused, "param", None) == "structured_outputs"

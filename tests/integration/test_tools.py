"""Tools and function calling against the real stack, through the openai SDK as an agent framework calls it: forced
calls (`tool_choice` "required" and a named function) parse as JSON and validate against the tool's schema,
streamed and not, and a two-turn round trip (the call, the tool's answer, the model's reply) works. The default
model is tiny: these assert shapes and validity, never what the model chose to say."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.support.service import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather in Paris? Call the tool."}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHOICES = [("required", "tool_calls"), (NAMED, "stop")]  # OpenAI's (and vLLM's) finish reasons
# With parallel calls allowed the tiny model repeats its call until max_tokens (seen here: the same call four
# times, then cut off); one call is what these tests need to finish.
ONE_CALL = {"parallel_tool_calls": False}


def _check_call(call_id: str, name: str, arguments: str) -> dict:
    assert call_id.startswith("call_"), call_id
    assert name in SCHEMAS, name
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, SCHEMAS[name])
    return parsed


def _streamed_calls(stream) -> tuple[list[tuple[str, str, str]], str | None]:
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for tc in choice.delta.tool_calls or ():
            if tc.id is not None:
                assert tc.index not in calls and tc.type == "function"
                calls[tc.index] = [tc.id, tc.function.name, tc.function.arguments or ""]
            else:
                calls[tc.index][2] += tc.function.arguments or ""
    return [tuple(c) for c in calls.values()], finish  # type: ignore[misc]


@pytest.mark.parametrize("tool_choice, finish", CHOICES, ids=["required", "named"])
def test_forced_calls_are_valid_and_a_round_trip_works(client, tool_choice, finish):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice=tool_choice,
                                           temperature=0, max_tokens=120, **ONE_CALL)
    choice = reply.choices[0]
    assert choice.finish_reason == finish, choice
    calls = choice.message.tool_calls
    assert calls, choice.message
    for call in calls:
        assert call.type == "function"
        _check_call(call.id, call.function.name, call.function.arguments)
    if tool_choice == NAMED:
        assert [c.function.name for c in calls] == ["get_weather"]

    # The second turn: the assistant's call (content null) and the tool's answer go back to the model.
    messages = [*QUESTION,
                {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
                *({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature": 18})} for c in calls)]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=24)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens > reply.usage.prompt_tokens  # the call and the tool's answer were rendered


@pytest.mark.parametrize("tool_choice, finish", CHOICES, ids=["required", "named"])
def test_forced_calls_streamed_are_the_same_calls(client, tool_choice, finish):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice=tool_choice,
                                           temperature=0, max_tokens=120, **ONE_CALL).choices[0].message.tool_calls
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice=tool_choice,
                                            temperature=0, max_tokens=120, stream=True, **ONE_CALL,
                                            stream_options={"include_usage": True})
    calls, streamed_finish = _streamed_calls(stream)
    assert streamed_finish == finish
    assert [(name, _check_call(i, name, args)) for i, name, args in calls] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole]  # greedy: the same calls


def test_parallel_calls_cut_short_by_max_tokens_are_no_broken_calls(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=40)
    choice = reply.choices[0]
    if choice.finish_reason == "length":  # the array never closed: no call, as vLLM answers
        assert not choice.message.tool_calls
    for call in choice.message.tool_calls or ():
        _check_call(call.id, call.function.name, call.function.arguments)


async def test_async_sdk_round_trip_streamed(async_client):
    stream = await async_client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS,
                                                        tool_choice=NAMED, temperature=0, max_tokens=120, stream=True)
    arguments, call_id = "", None
    async for chunk in stream:
        for tc in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
            call_id = tc.id or call_id
            arguments += tc.function.arguments or ""
    assert call_id is not None
    _check_call(call_id, "get_weather", arguments)
    second = await async_client.chat.completions.create(model=MODEL, max_tokens=16, temperature=0, messages=[
        *QUESTION,
        {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function",
                                              "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "18 degrees, sunny"}])
    assert second.choices[0].message.content


@pytest.mark.parametrize("kwargs, param", [
    ({"tools": TOOLS}, "tool_choice"),  # "auto": the default model has no tool-call parser configured
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                            "properties": {"a": {"type": 7}}}}}],
      "tool_choice": "required"}, "tools"),
    # a valid JSON Schema that the engine's grammar compiler refuses (an unresolvable $ref): the engine's
    # refusal, still before any byte, naming tools
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_tool_requests_are_400s_before_any_byte(client, kwargs, param, stream):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, stream=stream, **kwargs)
    body = err.value.body
    assert err.value.status_code == 400 and set(body) == {"message", "type", "param", "code"}, body
    assert body["param"] == param, body


def test_langchain_binds_tools(service):
    """LangChain's OpenAI chat model with bound tools, as agent frameworks use it: a forced call comes back as
    an AIMessage tool call whose args validate, and the tool's answer goes back for the model's reply."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    from tests.support.service import API_KEY

    llm = ChatOpenAI(base_url=f"{service.base_url}/v1", api_key=API_KEY, model=MODEL, temperature=0, max_tokens=120,
                     max_retries=0)
    bound = llm.bind_tools(TOOLS, tool_choice="get_weather", parallel_tool_calls=False)
    question = HumanMessage("What is the weather in Paris?")
    reply = bound.invoke([question])
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(call["args"], WEATHER)
    answer = llm.invoke([question, reply, ToolMessage("18 degrees, sunny", tool_call_id=call["id"])])
    assert answer.content and not answer.tool_calls

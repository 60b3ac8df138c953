"""The Responses API (`POST /v1/responses`) against the in-process stack, through the openai SDK's
`client.responses.create` (which parses our objects and events into its own types): text and message-list input,
instructions, limits, function tools forced and round-tripped, streaming with the Responses event types, usage,
the stateless refusals, and chat's admission and errors on the new route."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from app.engine.fake import FakeEngine
from app.engine.fake_model import ANSWER
from app.errors import InvalidRequest
from app.openai.chat import ChatCompletionRequest
from app.openai.responses_api import ResponsesRequest
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import DEFAULT_MAX_TOKENS, MAX_TOKENS, MODEL_ID, Stack, listening, make_config
from tests.support.waiting import until

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}]
NAMED = {"type": "function", "name": "get_weather"}


@pytest.fixture
async def oai(stack):
    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=stack.app)))
    yield client
    await client.close()


# -- the conversion into chat -------------------------------------------------------------------------------


def test_input_instructions_and_items_become_the_chat_conversation():
    chat = ResponsesRequest(model=MODEL_ID, instructions="Be brief.", max_output_tokens=7, temperature=0.5,
                            top_p=0.9, input=[
                                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                                {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                                 "arguments": '{"city": "Paris"}'},
                                {"type": "function_call", "call_id": "call_2", "name": "get_weather",
                                 "arguments": '{"city": "Rome"}'},
                                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                                {"type": "message", "role": "assistant",
                                 "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}]},
                            ], tools=TOOLS, tool_choice="none").to_chat()
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (7, 0.5, 0.9)
    system, user, calls, tool, assistant = (m.for_template() for m in chat.messages)
    assert system == {"role": "system", "content": "Be brief."} and user["content"] == "Weather?"
    assert [c["function"]["arguments"] for c in calls["tool_calls"]] == [{"city": "Paris"}, {"city": "Rome"}]
    assert tool == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert assistant == {"role": "assistant", "content": "It is sunny."}
    assert [t.function.name for t in chat.tools or ()] == ["get_weather"]


def test_reasoning_items_join_their_turn_s_assistant_message_as_vllm_joins_them():
    thought = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look it up."}]}
    chat = ResponsesRequest(model=MODEL_ID, input=[
        {"role": "user", "content": "Weather?"},
        thought,
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {**thought, "summary": [], "content": [{"type": "reasoning_text", "text": "Say it."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
    ], tools=TOOLS, tool_choice="none").to_chat()
    user, calls, tool, answer = (m.for_template() for m in chat.messages)
    assert calls["reasoning"] == calls["reasoning_content"] == "Look it up." and calls["content"] == ""
    assert [c["function"]["name"] for c in calls["tool_calls"]] == ["get_weather"]
    assert tool["role"] == "tool" and user["role"] == "user"
    assert answer == {"role": "assistant", "content": "Sunny.", "reasoning": "Say it.", "reasoning_content": "Say it."}


def test_an_assistant_s_reasoning_reaches_the_template_as_vllm_passes_it():
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi", "reasoning": "ignored"},
                                            {"role": "assistant", "content": "Hello", "reasoning": "Greet back."}]}
    user, assistant = (m.for_template() for m in ChatCompletionRequest.model_validate(body).messages)
    assert "reasoning" not in user
    assert assistant["reasoning"] == assistant["reasoning_content"] == "Greet back."


@pytest.mark.parametrize("kwargs, param, named", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input",
     "input[0].content[0] is a content part of type 'input_image'"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "input[0] is an item of type 'item_reference'"),
    ({"tools": [{"type": "web_search"}]}, "tools", "tools[0] is a tool of type 'web_search'"),
    ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [NAMED]}}, "tool_choice",
     "tool_choice of type 'allowed_tools'"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}]}, "input",
     "Encrypted content is not supported."),
])
async def test_a_type_this_service_does_not_serve_is_named_in_its_400(oai, kwargs, param, named):
    with pytest.raises(openai.BadRequestError) as err:
        await oai.responses.create(**{"model": MODEL_ID, "input": "Hello", **kwargs})
    assert err.value.body["param"] == param and named in err.value.body["message"], err.value.body


async def test_a_conversation_with_another_model_s_reasoning_is_answered(oai):
    thought = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Greet."}]}
    response = await oai.responses.create(model=MODEL_ID, max_output_tokens=4, input=[
        {"role": "user", "content": "Hi"}, thought, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"}])
    assert response.output_text


def test_text_format_becomes_response_format():
    chat = ResponsesRequest(model=MODEL_ID, input="hi", text={"format": {"type": "json_schema", "name": "w",
                                                                         "schema": WEATHER}}).to_chat()
    assert chat.response_format is not None and chat.response_format.json_schema is not None
    assert chat.response_format.json_schema.schema_ == WEATHER


# -- through the SDK ------------------------------------------------------------------------------------------


async def test_text_input(oai):
    response = await oai.responses.create(model=MODEL_ID, input="Hello", instructions="Be kind.")
    assert response.object == "response" and response.status == "completed" and response.id.startswith("resp_")
    assert response.output_text == ANSWER
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    usage = response.usage
    assert usage is not None and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.instructions == "Be kind."


async def test_max_output_tokens_cuts_short_as_incomplete(oai):
    response = await oai.responses.create(model=MODEL_ID, input="Hello", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3


async def test_streamed_events(oai):
    stream = await oai.responses.create(model=MODEL_ID, input=[{"role": "user", "content": "Hello"}], stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == ANSWER == events[-4].text
    final = events[-1].response
    assert final.output_text == ANSWER and final.usage.output_tokens > 0
    assert events[0].response.status == "in_progress" and events[0].response.output == []


@pytest.mark.parametrize("stream", [False, True])
async def test_a_forced_function_call_and_its_round_trip(oai, stream):
    kwargs = {"model": MODEL_ID, "input": "Weather in Paris?", "tools": TOOLS, "tool_choice": NAMED,
              "max_output_tokens": 60}
    if stream:
        events = [e async for e in await oai.responses.create(stream=True, **kwargs)]
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == \
            done.arguments
        response = events[-1].response
    else:
        response = await oai.responses.create(**kwargs)
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)

    follow_up = await oai.responses.create(model=MODEL_ID, tools=TOOLS, tool_choice="none", input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert follow_up.output_text == ANSWER


async def test_required_tools_call(oai):
    response = await oai.responses.create(model=MODEL_ID, input="Weather?", tools=TOOLS, tool_choice="required",
                                          parallel_tool_calls=False, max_output_tokens=60)
    assert [item.type for item in response.output] == ["function_call"]
    assert response.parallel_tool_calls is False


@pytest.mark.parametrize("kwargs, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"max_output_tokens": MAX_TOKENS + 1}, "max_output_tokens"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"input": []}, "input"),
    ({"tools": TOOLS}, "tool_choice"),  # "auto" needs the model's tool-call parser
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}], "tool_choice": "required"},
     "tools"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": TOOLS}, "tool_choice"),
    ({"reasoning": {"effort": "high", "summary": "brief"}}, "reasoning"),  # not one of OpenAI's summary values
    ({"stream_options": {"include_obfuscation": True}}, "stream_options"),  # asks for padding this service lacks
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ({"extra_body": {"vllm_xargs": {"a": 1}}}, "vllm_xargs"),  # vLLM's, for what is not run here: named
    ({"input": "x" * 300}, "input"),  # past the fake model's context: the length contract names `input`
])
@pytest.mark.parametrize("stream", [False, True])
async def test_refusals_are_openai_shaped_400s_naming_the_parameter(oai, kwargs, param, stream):
    kwargs = {"model": MODEL_ID, "input": "Hello", **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        await oai.responses.create(stream=stream, **kwargs)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param or str(err.value.body["param"]).startswith(param), err.value.body


@pytest.mark.parametrize("tool_choice", [None, "auto", "none"])
def test_an_empty_tools_list_is_a_request_without_tools(tool_choice):
    # What the OpenAI Agents SDK sends for an agent without tools (OpenAI's API takes it; chat's `tools: []` is a 400).
    chat = ResponsesRequest(model=MODEL_ID, input="Hi", tools=[], tool_choice=tool_choice).to_chat()
    assert chat.tools is None and chat.tool_choice is None


def test_an_empty_tools_list_with_a_call_required_is_refused():
    with pytest.raises(InvalidRequest) as err:
        ResponsesRequest(model=MODEL_ID, input="Hi", tools=[], tool_choice="required").to_chat()
    assert err.value.param == "tool_choice"


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_openai_agents_sdk_agent_without_tools_is_answered(oai, streamed):
    import agents

    agents.set_tracing_disabled(True)  # the SDK's tracing would export to OpenAI
    agent = agents.Agent(name="a", instructions="Be brief.", model=agents.OpenAIResponsesModel(
        model=MODEL_ID, openai_client=oai))  # the SDK's default model kind, which sends `tools: []`
    if streamed:
        run = agents.Runner.run_streamed(agent, "Hello")
        async for _ in run.stream_events():
            pass
        assert run.final_output == ANSWER
    else:
        assert (await agents.Runner.run(agent, "Hello")).final_output == ANSWER


async def test_vllm_s_sampling_extensions_are_taken_as_vllm_s_responses_api_takes_them(oai):
    extensions = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "seed": 3, "stop": ["fake"],
                  "presence_penalty": 0.5, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False},
                  "priority": 2, "session_id": "conv-3"}
    chat = ResponsesRequest(model=MODEL_ID, input="Hi", **extensions).to_chat()
    assert {k: getattr(chat, k) for k in extensions} == extensions
    constrained = ResponsesRequest(model=MODEL_ID, input="Hi", structured_outputs={"choice": ["yes", "no"]})
    assert constrained.to_chat().to_params(make_config().models[0].limits).choice == ("yes", "no")
    answered = {k: v for k, v in extensions.items() if k != "ignore_eos"}  # with it the answer runs to its limit
    response = await oai.responses.create(model=MODEL_ID, input="Hello", extra_body=answered)
    assert response.status == "completed" and "fake" not in response.output_text  # cut at the stop string
    with pytest.raises(openai.BadRequestError) as err:  # checked as chat checks it, named as sent
        await oai.responses.create(model=MODEL_ID, input="Hello", extra_body={"top_k": -5})
    assert err.value.body["param"] == "top_k"


async def test_a_reasoning_effort_goes_to_the_template_as_chat_s(oai):
    chat = ResponsesRequest(model=MODEL_ID, input="Hi", reasoning={"effort": "low"}).to_chat()
    assert chat.reasoning_effort == "low"
    response = await oai.responses.create(model=MODEL_ID, input="Hello", reasoning={"effort": "low"})
    assert response.status == "completed" and response.reasoning.effort == "low"


@pytest.mark.parametrize("reasoning", [{"effort": "low", "summary": "auto"}, {"generate_summary": "concise"}])
async def test_a_reasoning_summary_is_taken_as_vllm_takes_it_and_none_is_made(oai, reasoning):
    """LangChain's and the Agents SDK's reasoning settings send a summary; `vllm serve` takes it. No reasoning item
    comes back (there is none to summarize), and the setting is echoed."""
    response = await oai.responses.create(model=MODEL_ID, input="Hello", reasoning=reasoning)
    assert response.status == "completed" and response.output_text
    assert [item.type for item in response.output] == ["message"]
    assert response.reasoning.summary == (reasoning.get("summary") or reasoning.get("generate_summary"))
    events = [e async for e in await oai.responses.create(model=MODEL_ID, input="Hello", reasoning=reasoning,
                                                          stream=True)]
    assert events[-1].type == "response.completed"
    assert not [e for e in events if "reasoning" in e.type]


async def test_stream_options_without_obfuscation_is_what_the_service_does_anyway(oai):
    events = [e.type async for e in await oai.responses.create(
        model=MODEL_ID, input="Hello", stream=True, stream_options={"include_obfuscation": False})]
    assert events[-1] == "response.completed"


async def test_vllm_s_request_id_is_the_response_s_id_as_sent(oai):
    named = await oai.responses.create(model=MODEL_ID, input="Hi", extra_body={"request_id": "resp_order-7"})
    assert named.id == "resp_order-7" and named.output[0].id.startswith("msg_")
    unnamed = await oai.responses.create(model=MODEL_ID, input="Hi")
    assert unnamed.id.startswith("resp_") and unnamed.id != named.id
    with pytest.raises(openai.BadRequestError) as err:
        await oai.responses.create(model=MODEL_ID, input="Hi", extra_body={"request_id": "x" * 129})
    assert err.value.body["param"] == "request_id"


async def test_store_and_metadata_are_accepted_and_nothing_is_stored(oai):
    response = await oai.responses.create(model=MODEL_ID, input="Hello", store=True, metadata={"k": "v"})
    assert response.status == "completed" and response.store is False and response.metadata == {"k": "v"}


async def test_unknown_model_and_bad_json_have_the_openai_shape(client):
    resp = await client.post("/v1/responses", json={"model": "nope", "input": "hi"})
    assert resp.status_code == 404 and assert_error_shape(404, resp.headers["content-type"], resp.content)
    resp = await client.post("/v1/responses", content=b"{", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and assert_error_shape(400, resp.headers["content-type"], resp.content)


async def test_the_default_length_is_chats(oai):
    response = await oai.responses.create(model=MODEL_ID, input="Hello", extra_body={"stream": False})
    assert response.usage.output_tokens <= DEFAULT_MAX_TOKENS


async def test_a_client_that_leaves_a_stream_aborts_the_engine_request():
    # A real socket (the replica's own listener): a client's hang-up is seen as on the real stack.
    engine = FakeEngine(max_model_len=256, token_delay_s=0.3)  # the answer's 9 tokens take 2.7 s
    stack = Stack(make_config(), engine)
    async with listening(stack) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
            body = {"model": MODEL_ID, "input": "Hello", "stream": True}
            async with client.stream("POST", "/v1/responses", json=body) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if "response.output_text.delta" in line:
                        break
        await engine.wait_aborted(count=1)
        await until(lambda: stack.host.admission.stats().in_system == 0, what="the admission slot released")

"""The Responses API against the real stack through the openai SDK (`client.responses.create`), streaming and
not, sync and async: text and message-list input, instructions, max_output_tokens, a forced function call and its
round trip, usage, and the stateless refusal. Shapes and validity only: the default model is tiny."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.support.service import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]

QUESTION = "What is the capital of France?"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}]


def test_text_input(client):
    response = client.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=24)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert response.output_text and response.output[0].type == "message"
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # the same conversation through chat: the same greedy text (the Responses API is served as chat)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                          temperature=0, max_tokens=24)
    assert response.output_text == chat.choices[0].message.content
    assert usage.input_tokens == chat.usage.prompt_tokens


def test_messages_instructions_and_max_output_tokens(client):
    response = client.responses.create(model=MODEL, instructions="Answer in one word.", temperature=0, top_p=1,
                                       max_output_tokens=3, input=[{"role": "user", "content": QUESTION}])
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.instructions == "Answer in one word."


def test_streamed(client):
    events = list(client.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=24,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.done" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert text and text == done.text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens > 0


async def test_async_forced_call_round_trip_streamed(async_client):
    stream = await async_client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=TOOLS,
                                                 tool_choice={"type": "function", "name": "get_weather"},
                                                 temperature=0, max_output_tokens=60, stream=True)
    events = [e async for e in stream]
    (call,) = [item for item in events[-1].response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    follow_up = await async_client.responses.create(model=MODEL, max_output_tokens=16, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}])
    assert follow_up.output_text


def test_required_call_not_streamed(client):
    response = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=False, temperature=0,
                                       max_output_tokens=60)
    (call,) = response.output
    assert call.type == "function_call"
    jsonschema.validate(json.loads(call.arguments), WEATHER)


@pytest.mark.parametrize("kwargs, param", [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"max_output_tokens": 100_000}, "max_output_tokens"),
    ({"input": "x " * 5000}, "input"),
])
def test_refusals(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, **{"input": QUESTION, **kwargs})
    assert err.value.status_code == 400 and err.value.body["param"] == param, err.value.body


async def test_an_openai_agents_sdk_turn_with_a_tool(service):
    """The OpenAI Agents SDK (Responses API by default; the `dev` extra installs it) runs one tool-using turn."""
    import agents
    from openai import AsyncOpenAI

    from tests.support.service import API_KEY

    agents.set_tracing_disabled(True)  # the SDK's tracing would export to OpenAI
    called: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        called.append(city)
        return f"18 degrees and sunny in {city}"

    client = AsyncOpenAI(base_url=f"{service.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    agent = agents.Agent(
        name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                            temperature=0),
        tool_use_behavior="stop_on_first_tool",  # the tool's answer ends the turn (a forced choice would loop)
    )
    result = await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=2)
    assert len(called) == 1 and result.final_output == f"18 degrees and sunny in {called[0]}"

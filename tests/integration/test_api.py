"""The OpenAI API against the real stack, through the openai SDK and raw HTTP."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support import sse
from tests.support.service import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_lists_the_default_model(client):
    models = client.models.list()
    assert [m.id for m in models.data][0] == MODEL
    assert client.models.retrieve(MODEL).id == MODEL


def test_greedy_chat_answers_the_known_question(client, http):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30)
    choice = r.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    assert r.model == MODEL and r.id.startswith("chatcmpl-") and r.created > 0
    counted = http.post("/tokenize", json={"model": MODEL, "messages": QUESTION}).json()["count"]
    assert r.usage.prompt_tokens == counted
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert 0 < r.usage.completion_tokens <= 30


def test_max_tokens_ends_with_length(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_completion_tokens=2)
    assert r.usage.completion_tokens == 2


def test_stop_sequence_is_honoured(client):
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                          max_tokens=30).choices[0].message.content
    assert " of" in full
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30, stop=[" of"])
    assert r.choices[0].message.content == full[: full.index(" of")]
    assert r.choices[0].finish_reason == "stop"


def test_stream_matches_non_stream_and_reports_usage(client):
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert len([c for c in chunks if c.choices]) > 1  # tokens arrive as they are made, not all at once


async def test_async_client_streams_and_answers(async_client):
    r = await async_client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=10)
    stream = await async_client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=10,
                                                        stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == r.choices[0].message.content


def test_raw_sse_framing(http):
    body = {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 4, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = sse.parse(raw)
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])


def test_n_choices_and_seed(client):
    a = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=1.0, max_tokens=12, n=3, seed=7)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    b = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=1.0, max_tokens=12, n=3, seed=7)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len({c.message.content for c in a.choices}) > 1  # choices are distinct samples


def test_completions_and_echo(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=5)
    assert r.object == "text_completion" and r.usage.completion_tokens == 5
    echoed = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=5,
                                       echo=True)
    assert echoed.choices[0].text == "The capital of France is" + r.choices[0].text


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="nope", messages=QUESTION)
    assert err.value.body["code"] == "model_not_found"


def test_context_length_is_a_400_naming_the_numbers(client):
    long_text = "hello " * 1500
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_text}], max_tokens=1000)
    message = err.value.body["message"]
    assert message.startswith("This model's maximum context length is 2048 tokens. However, you requested ")
    assert "in the messages, 1000 in the completion" in message
    assert err.value.body["param"] == "messages"


def test_wrong_key_is_authentication_error(base_url):
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    assert httpx.get(f"{base_url}/health").status_code == 200  # health stays open


def test_malformed_json_is_an_openai_400(http):
    r = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_schema_the_engine_cannot_compile_is_a_400_before_streaming(http, client):
    body = {"model": MODEL, "messages": QUESTION, "stream": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20)
    assert "Paris" in answer.choices[0].message.content


def test_json_schema_output_validates(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "answer", "schema": schema}})
    data = json.loads(r.choices[0].message.content)
    assert isinstance(data["city"], str)


def test_request_id_is_echoed(http):
    r = http.get("/v1/models", headers={"X-Request-Id": "my-trace-123"})
    assert r.headers["x-request-id"] == "my-trace-123"

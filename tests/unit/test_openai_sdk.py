"""The official openai SDK against the in-process app: it parses our responses and maps our errors."""

from __future__ import annotations

import httpx
import openai
import pytest

from app.api_keys import API_KEYS_ENV
from app.engine.fake_model import ANSWER
from tests.support.fake_stack import MODEL_ID, make_config

MESSAGES = [{"role": "user", "content": "Hello"}]


def sdk(app, api_key: str = "x") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key=api_key, max_retries=0,
                              http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app)))


@pytest.fixture
async def oai(stack):
    client = sdk(stack.app)
    yield client
    await client.close()


async def test_sdk_models(oai):
    models = await oai.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]


async def test_sdk_chat(oai):
    resp = await oai.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=50)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == ANSWER
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


async def test_sdk_chat_stream(oai):
    stream = await oai.chat.completions.create(model=MODEL_ID, messages=MESSAGES, stream=True,
                                               stream_options={"include_usage": True})
    text, finish, usage, roles = "", None, None, []
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            roles.append(choice.delta.role)
            finish = choice.finish_reason or finish
    assert text == ANSWER
    assert roles[0] == "assistant"
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == len(ANSWER.split(" "))


async def test_sdk_chat_stream_of_several_choices_sends_one_choice_per_chunk(oai):
    """As vLLM's server and OpenAI do: a client that reads `choices[0]` of each chunk (code written against them)
    gets every choice whole."""
    stream = await oai.chat.completions.create(model=MODEL_ID, messages=MESSAGES, stream=True, n=3, max_tokens=6)
    texts, sizes = {}, set()
    async for chunk in stream:
        sizes.add(len(chunk.choices))
        choice = chunk.choices[0]
        texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    whole = await oai.chat.completions.create(model=MODEL_ID, messages=MESSAGES, n=3, max_tokens=6)
    assert sizes == {1}
    assert texts == {c.index: c.message.content for c in whole.choices} and len(texts) == 3


async def test_sdk_completion(oai):
    resp = await oai.completions.create(model=MODEL_ID, prompt="Say", max_tokens=2)
    assert resp.choices[0].text == " ".join(ANSWER.split(" ")[:2]) + " "
    assert resp.choices[0].finish_reason == "length"


async def test_sdk_not_found(oai):
    with pytest.raises(openai.NotFoundError) as info:
        await oai.chat.completions.create(model="nope", messages=MESSAGES)
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"


async def test_sdk_bad_request(oai):
    with pytest.raises(openai.BadRequestError) as info:
        await oai.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=100_000)
    assert info.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as info:
        await oai.chat.completions.create(model=MODEL_ID, messages=MESSAGES, extra_body={"foo": 1})
    assert info.value.param == "foo"
    assert "Unrecognized request argument supplied: foo" in info.value.message


async def test_sdk_authentication(make_stack, monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    stack = make_stack(make_config(service={"api_keys": ["sk-good"]}))
    bad, good = sdk(stack.app, "sk-bad"), sdk(stack.app, "sk-good")
    try:
        with pytest.raises(openai.AuthenticationError) as info:
            await bad.chat.completions.create(model=MODEL_ID, messages=MESSAGES)
        assert info.value.status_code == 401
        resp = await good.chat.completions.create(model=MODEL_ID, messages=MESSAGES)
        assert resp.choices[0].message.content == ANSWER
    finally:
        await bad.close()
        await good.close()


async def test_sdk_stream_helper_assembles_every_choice(oai):
    """The SDK's own stream helper (`chat.completions.stream`, which accumulates chunks by choice) builds from our
    chunks the same choices as the answer without streaming."""
    async with oai.chat.completions.stream(model=MODEL_ID, messages=MESSAGES, n=2, max_tokens=50) as stream:
        final = await stream.get_final_completion()
    whole = await oai.chat.completions.create(model=MODEL_ID, messages=MESSAGES, n=2, max_tokens=50)
    assert [(c.index, c.message.content, c.finish_reason) for c in final.choices] == [
        (c.index, c.message.content, c.finish_reason) for c in whole.choices]

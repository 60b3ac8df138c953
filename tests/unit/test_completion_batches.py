"""A list of prompts in one `/v1/completions` request: each prompt an engine request of its own, the choices
numbered as OpenAI numbers them (prompt i's choice j is choice i * n + j), usage summed over the prompts, echo per
prompt, streamed and not; admitted whole or refused whole."""

from __future__ import annotations

import httpx
import openai
import pytest

from app.engine.fake import FakeEngine
from app.engine.fake_model import ANSWER
from tests.support.fake_stack import MODEL_ID, Stack, listening, make_config
from tests.support.sse import parse
from tests.support.waiting import until


def body(prompt, **extra):
    return {"model": MODEL_ID, "prompt": prompt, "max_tokens": 4, **extra}


async def test_choices_are_numbered_prompt_by_prompt(client, stack):
    resp = await client.post("/v1/completions", json=body(["a", "bb", "ccc"], n=2, temperature=1))
    assert resp.status_code == 200, resp.text
    reply = resp.json()
    assert [c["index"] for c in reply["choices"]] == list(range(6))
    one = (await client.post("/v1/completions", json=body("a", n=2, temperature=1))).json()
    # the fake engine's choice j differs from its choice j+1, and each prompt's choices repeat that pattern
    assert [c["text"] for c in reply["choices"][:2]] == [c["text"] for c in one["choices"]]
    assert [c["text"] for c in reply["choices"][2:4]] == [c["text"] for c in one["choices"]]
    usage = reply["usage"]
    assert usage["prompt_tokens"] == 1 + 2 + 3  # one token per byte in the fake engine
    assert usage["completion_tokens"] == 6 * 4 and usage["total_tokens"] == 6 + 24


async def test_echo_per_prompt_text_and_token_ids(client):
    texts = (await client.post("/v1/completions", json=body(["Q1 ", "Q2 "], echo=True))).json()["choices"]
    assert [c["text"][:3] for c in texts] == ["Q1 ", "Q2 "]
    ids = (await client.post("/v1/completions", json=body([[65, 66], [67]], echo=True))).json()["choices"]
    assert [c["text"][: len(p)] for c, p in zip(ids, ["AB", "C"], strict=True)] == ["AB", "C"]


async def test_streamed_batch(client):
    resp = await client.post("/v1/completions", json=body(["a", "b"], stream=True,
                                                          stream_options={"include_usage": True}))
    events = parse(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    texts: dict[int, str] = {}
    finished = set()
    for chunk in chunks[:-1]:
        for c in chunk["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            if c["finish_reason"]:
                finished.add(c["index"])
    assert set(texts) == finished == {0, 1}
    assert texts[0] == texts[1] == " ".join(ANSWER.split(" ")[:4]) + " "
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 2


async def test_the_sdk_sends_and_reads_a_batch(stack):
    async with openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", max_retries=0,
                                  http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=stack.app))) as oai:
        reply = await oai.completions.create(model=MODEL_ID, prompt=["a", "b", "c"], max_tokens=2)
    assert [c.index for c in reply.choices] == [0, 1, 2]


async def test_one_prompt_refused_refuses_the_batch_and_aborts_the_others(client, stack):
    resp = await client.post("/v1/completions", json=body(["a", "x" * 300, "b"]))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
    assert resp.json()["error"]["code"] == "context_length_exceeded"
    await until(lambda: stack.host.admission.stats().in_system == 0, what="every prompt's slot released")
    assert not stack.engine.running


@pytest.mark.parametrize("prompt, param", [
    (["a"] * 33, "prompt"), ([[1], []], "prompt"), (["a", [1]], "prompt"), ([], "prompt"), ([[]], "prompt"),
])
async def test_bad_batches(client, prompt, param):
    resp = await client.post("/v1/completions", json=body(prompt))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


async def test_a_client_that_leaves_a_streamed_batch_aborts_every_prompt():


    engine = FakeEngine(max_model_len=256, token_delay_s=0.3)
    stack = Stack(make_config(), engine)
    async with listening(stack) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
            async with client.stream("POST", "/v1/completions",
                                     json=body(["a", "b", "c"], stream=True, max_tokens=50)) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        break
        await engine.wait_aborted(count=3)
        await until(lambda: stack.host.admission.stats().in_system == 0, what="every prompt's slot released")


async def test_a_batch_larger_than_the_free_slots_still_runs(client, stack):
    # 4 slots here: the first prompts generate and finish while the last ones wait for their slots
    assert stack.host.admission.max_running == 4
    for stream in (False, True):
        resp = await client.post("/v1/completions", json=body([f"p{i}" for i in range(7)], stream=stream))
        assert resp.status_code == 200, resp.text
        if not stream:
            assert [c["index"] for c in resp.json()["choices"]] == list(range(7))
        else:
            assert parse(resp.text)[-1] == "[DONE]" and '"error"' not in resp.text

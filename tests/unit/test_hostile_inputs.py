"""Hand-written hostile requests against the in-process app (FastAPI -> EngineHost -> FakeEngine).

Every case must end in a client error in the OpenAI shape that names the parameter where
there is one, never a 5xx, a 422 or a hang; and the app must answer a normal request right
after it. The list lives in tests/support/hostile.py: tests/integration/test_fuzz_real.py sends
the same list once to the real stack, so it must not depend on the fake engine.
"""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import pytest

from app.engine.fake import FakeEngine
from tests.support.fake_stack import MODEL_ID, make_config
from tests.support.hostile import (
    CASE_TIMEOUT_S,
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    Hostile,
    abody_chunks,
    as_json,
    check_outcome,
    embedding_cases,
    hostile_cases,
    request_args,
    small_chat,
    stream_is_clean,
)

CASES = hostile_cases(MODEL_ID)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_hostile_input(client: httpx.AsyncClient, case: Hostile):
    content = abody_chunks(case.body) if case.chunked else case.body
    response = await asyncio.wait_for(client.post(case.path, content=content, **request_args(case)), CASE_TIMEOUT_S)
    if case.chunked:
        assert "content-length" not in response.request.headers
    check_outcome(case, response.status_code, response.headers.get("content-type", ""), response.content)
    stream_is_clean(case, response.headers.get("content-type", ""), response.text)
    # the app still answers a normal request right after it
    normal = await asyncio.wait_for(client.post(CHAT, json=small_chat(MODEL_ID)), CASE_TIMEOUT_S)
    assert normal.status_code == 200, normal.text
    assert normal.json()["choices"][0]["message"]["content"]


async def test_fake_engine_answers_where_a_real_one_might_refuse(client: httpx.AsyncClient):
    """The lone-surrogate cases the fake engine accepts come back as valid UTF-8 JSON, the surrogate
    escaped as JSON allows (it used to be a UnicodeEncodeError, a 500)."""
    json_type = {"content-type": "application/json"}
    echo = {"model": MODEL_ID, "prompt": "a\ud800b", "echo": True, "max_tokens": 2}
    echoed = await client.post(COMPLETIONS, content=as_json(echo), headers=json_type)
    assert echoed.status_code == 200, echoed.text
    assert b"\\ud800" in echoed.content
    assert json.loads(echoed.content)["choices"][0]["text"].startswith("a\ud800b")
    streamed = await client.post(COMPLETIONS, content=as_json({**echo, "stream": True}), headers=json_type)
    assert streamed.status_code == 200 and "internal_error" not in streamed.text, streamed.text
    unknown = await client.post("/tokenize", content=as_json({"model": "m\udc00", "prompt": "Hi"}), headers=json_type)
    assert unknown.status_code == 404
    assert json.loads(unknown.content)["error"]["message"].startswith("The model 'm\udc00'")


@pytest.mark.parametrize("body, headers, says", [
    (gzip.compress(as_json(small_chat(MODEL_ID))), {"content-encoding": "gzip"}, "Content-Encoding 'gzip'"),
    (as_json(small_chat(MODEL_ID, "caf\u00e9")).replace(b"\\u00e9", b"\xe9"), {}, "not UTF-8 text"),
    (b'{"model": "m", "seed": ' + b"9" * 5000 + b"}", {}, "more than 4300 digits"),
], ids=["gzip", "latin-1", "5000-digit-number"])
async def test_a_body_the_parser_cannot_read_is_a_400_that_says_why(client: httpx.AsyncClient, body, headers, says):
    # FastAPI's own words were "There was an error parsing the body", whatever the cause.
    r = await client.post(CHAT, content=body, headers={"content-type": "application/json", **headers})
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


class StrictTextEngine(FakeEngine):
    """Encodes as vLLM's Hugging Face tokenizer does: a lone surrogate is not text, and its TypeError says only
    "TextEncodeInput must be Union[TextInputSequence, ...]"."""

    def encode(self, text: str) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, "
                            "InputSequence]]") from None
        return super().encode(text)


async def test_a_lone_surrogate_a_tokenizer_refuses_is_named_in_the_400(make_stack):
    stack = make_stack(engine=StrictTextEngine())
    json_type = {"content-type": "application/json"}
    for path, body, param in ((CHAT, small_chat(MODEL_ID, "Hi \ud800"), "messages"),
                              (COMPLETIONS, {"model": MODEL_ID, "prompt": "a\udfffb", "max_tokens": 2}, "prompt")):
        r = await stack.client.post(path, content=as_json(body), headers=json_type)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and "lone UTF-16 surrogate" in error["message"], error
    assert (await stack.client.post(CHAT, json=small_chat(MODEL_ID))).status_code == 200


async def test_no_engine_request_left_behind(client: httpx.AsyncClient, stack):
    for case in CASES:
        if not case.chunked:
            await asyncio.wait_for(client.post(case.path, content=case.body, **request_args(case)), CASE_TIMEOUT_S)
    stats = (await client.get("/stats")).json()[MODEL_ID]
    assert stats["engine"]["running"] == 0 and stats["admission"]["in_system"] == 0, stats
    assert not stack.engine.running
    assert (await client.get("/health")).status_code == 200


class NarrowTokenizerEngine(FakeEngine):
    """Decodes like a Hugging Face fast tokenizer: ids must fit in 32 bits, or OverflowError."""

    def decode(self, token_ids: list[int]) -> str:
        if any(not 0 <= t < 2**32 for t in token_ids):
            raise OverflowError("number too large to fit in target type")
        return super().decode(token_ids)


async def test_token_ids_past_the_tokenizer_are_a_400(make_stack):
    """/detokenize and an echoed token-id prompt decode ids; one the tokenizer cannot hold was a 500."""
    config = make_config()
    stack = make_stack(config, NarrowTokenizerEngine(max_model_len=config.models[0].engine.max_model_len))
    json_type = {"content-type": "application/json"}
    case = Hostile("detokenize-2e32", "/detokenize", as_json({"model": MODEL_ID, "tokens": [2**32]}), param="tokens")
    response = await stack.client.post(case.path, content=case.body, headers=json_type)
    check_outcome(case, response.status_code, response.headers["content-type"], response.content)
    case = Hostile("prompt-token-2e70-echo", COMPLETIONS,
                   as_json({"model": MODEL_ID, "prompt": [2**70], "max_tokens": 4, "echo": True}), param="prompt")
    response = await stack.client.post(case.path, content=case.body, headers=json_type)
    check_outcome(case, response.status_code, response.headers["content-type"], response.content)
    stats = (await stack.client.get("/stats")).json()[MODEL_ID]
    assert stats["admission"]["in_system"] == 0, stats  # the refused echo gave its admission ticket back
    detokenized = await stack.client.post("/detokenize", json={"model": MODEL_ID, "tokens": [72, 105]})
    assert detokenized.json() == {"prompt": "Hi"}


# -- /v1/embeddings: the same contract on an embedding model ------------------------------------

EMBED_MODEL = "fake-embed"
EMBEDDING_CASES = embedding_cases(EMBED_MODEL)


@pytest.fixture
def embed_client(make_stack) -> httpx.AsyncClient:
    config = make_config(runner="embed", id=EMBED_MODEL)
    return make_stack(config, FakeEngine(max_model_len=config.models[0].engine.max_model_len, matryoshka=True)).client


@pytest.mark.parametrize("case", EMBEDDING_CASES, ids=[c.name for c in EMBEDDING_CASES])
async def test_hostile_embeddings_input(embed_client: httpx.AsyncClient, case: Hostile):
    response = await asyncio.wait_for(embed_client.post(case.path, content=case.body, **request_args(case)),
                                      CASE_TIMEOUT_S)
    check_outcome(case, response.status_code, response.headers.get("content-type", ""), response.content)
    normal = await asyncio.wait_for(embed_client.post(EMBEDDINGS, json={"model": EMBED_MODEL, "input": "Hello"}),
                                    CASE_TIMEOUT_S)
    assert normal.status_code == 200, normal.text
    stats = (await embed_client.get("/stats")).json()[EMBED_MODEL]
    assert stats["engine"]["running"] == 0 and stats["admission"]["in_system"] == 0, stats

"""vLLM's `return_token_ids` through the in-process stack, in vLLM's shapes: chat puts the prompt's ids on the
response (a stream: on its first chunk), completions on each choice (a stream: each choice's first chunk); every
choice carries its output's ids (a stream: each chunk its piece's). Without it, none of these keys."""

from __future__ import annotations

from tests.support.fake_stack import MODEL_ID, chat_body
from tests.support.sse import parse


async def _prompt_ids(client, **prompt) -> list[int]:
    return (await client.post("/tokenize", json={"model": MODEL_ID, **prompt})).json()["tokens"]


async def test_chat(client):
    reply = (await client.post("/v1/chat/completions", json=chat_body(return_token_ids=True))).json()
    assert reply["prompt_token_ids"] == await _prompt_ids(client, messages=[{"role": "user", "content": "Hello"}])
    (choice,) = reply["choices"]
    assert len(choice["token_ids"]) == reply["usage"]["completion_tokens"]
    plain = (await client.post("/v1/chat/completions", json=chat_body())).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


async def test_chat_streamed(client):
    resp = await client.post("/v1/chat/completions", json=chat_body(return_token_ids=True, stream=True,
                                                                     stream_options={"include_usage": True}))
    chunks = [e for e in parse(resp.text) if isinstance(e, dict)]
    with_choices = [c for c in chunks if c["choices"]]
    expected = await _prompt_ids(client, messages=[{"role": "user", "content": "Hello"}])
    assert with_choices[0]["prompt_token_ids"] == expected
    assert all(c["prompt_token_ids"] is None for c in with_choices[1:])
    streamed = [t for c in with_choices for t in c["choices"][0]["token_ids"]]
    assert len(streamed) == chunks[-1]["usage"]["completion_tokens"]


async def test_completions_batch_streamed_and_not(client):
    body = {"model": MODEL_ID, "prompt": [[65, 66], [67]], "max_tokens": 3, "return_token_ids": True}
    reply = (await client.post("/v1/completions", json=body)).json()
    assert [c["prompt_token_ids"] for c in reply["choices"]] == [[65, 66], [67]]
    assert [len(c["token_ids"]) for c in reply["choices"]] == [3, 3]
    resp = await client.post("/v1/completions", json={**body, "stream": True})
    firsts: dict[int, list[int]] = {}
    for chunk in (e for e in parse(resp.text) if isinstance(e, dict)):
        for c in chunk["choices"]:
            if c["index"] not in firsts:
                firsts[c["index"]] = c["prompt_token_ids"]
            else:
                assert c["prompt_token_ids"] is None
    assert firsts == {0: [65, 66], 1: [67]}

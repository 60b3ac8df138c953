"""vLLM's `return_token_ids` through the in-process stack, in vLLM's shapes: chat puts the prompt's ids on the
response (a stream: on its first chunk, and no later chunk has the key), completions on each choice (a stream: each
choice's first chunk); every choice carries its output's ids (a stream: each chunk its piece's). Without it the same
keys are there, null, as vLLM sends them (clients read them unconditionally)."""

from __future__ import annotations

from tests.support.fake_stack import MODEL_ID, chat_body
from tests.support.responder import chunk_of
from tests.support.sse import parse


async def _prompt_ids(client, **prompt) -> list[int]:
    return (await client.post("/tokenize", json={"model": MODEL_ID, **prompt})).json()["tokens"]


async def test_chat(client):
    reply = (await client.post("/v1/chat/completions", json=chat_body(return_token_ids=True))).json()
    assert reply["prompt_token_ids"] == await _prompt_ids(client, messages=[{"role": "user", "content": "Hello"}])
    (choice,) = reply["choices"]
    assert len(choice["token_ids"]) == reply["usage"]["completion_tokens"]
    plain = (await client.post("/v1/chat/completions", json=chat_body())).json()
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None


async def test_chat_streamed(client):
    resp = await client.post("/v1/chat/completions", json=chat_body(return_token_ids=True, stream=True,
                                                                     stream_options={"include_usage": True}))
    chunks = [e for e in parse(resp.text) if isinstance(e, dict)]
    with_choices = [c for c in chunks if c["choices"]]
    expected = await _prompt_ids(client, messages=[{"role": "user", "content": "Hello"}])
    assert with_choices[0]["prompt_token_ids"] == expected
    assert len(with_choices) > 2 and not any("prompt_token_ids" in c for c in chunks[1:])  # vLLM's: first only
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


async def test_chat_streamed_without_them(client):
    """vLLM's first chunk says `prompt_token_ids: null`, its later chunks have no such key; every choice says
    `token_ids: null`."""
    resp = await client.post("/v1/chat/completions", json=chat_body(stream=True, n=2, temperature=1))
    chunks = [e for e in parse(resp.text) if isinstance(e, dict)]
    assert "prompt_token_ids" in chunks[0] and chunks[0]["prompt_token_ids"] is None
    assert len(chunks) > 2 and not any("prompt_token_ids" in c for c in chunks[1:])
    assert all(c["token_ids"] is None for chunk in chunks for c in chunk["choices"])


async def test_completions_with_echo_and_logprobs_and_an_emoji(client):
    """Each choice has its prompt's ids with `echo` and `logprobs` too, and with a character several bytes long
    (vLLM's test_return_token_ids: an emoji in the prompt); a stream has them on each choice's first chunk."""
    prompt = "I love coding \U0001f680"
    expected = await _prompt_ids(client, prompt=prompt)
    body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 1, "n": 2,
            "temperature": 1, "return_token_ids": True}
    reply = (await client.post("/v1/completions", json=body)).json()
    assert [c["prompt_token_ids"] for c in reply["choices"]] == [expected, expected]
    # vLLM's: with the prompt's ids given, the text leaves the prompt out; its tokens still head the logprobs.
    assert all(not c["text"].startswith(prompt) and len(c["token_ids"]) == 3 for c in reply["choices"])
    assert all(len(c["logprobs"]["tokens"]) == len(expected) + 3 for c in reply["choices"])
    plain = (await client.post("/v1/completions", json={**body, "return_token_ids": False})).json()
    assert all(c["text"].startswith(prompt) for c in plain["choices"])  # echo alone still echoes
    resp = await client.post("/v1/completions", json={**body, "stream": True})
    seen: dict[int, list] = {}
    for chunk in (e for e in parse(resp.text) if isinstance(e, dict)):
        for c in chunk["choices"]:
            seen.setdefault(c["index"], []).append(c["prompt_token_ids"])
    assert {i: ids[0] for i, ids in seen.items()} == {0: expected, 1: expected}
    assert all(later is None for ids in seen.values() for later in ids[1:])


async def test_completions_without_them_say_null(client):
    body = {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2}
    (choice,) = (await client.post("/v1/completions", json=body)).json()["choices"]
    assert "prompt_token_ids" in choice and choice["prompt_token_ids"] is None and choice["token_ids"] is None
    resp = await client.post("/v1/completions", json={**body, "stream": True})
    streamed = [c for e in parse(resp.text) if isinstance(e, dict) for c in e["choices"]]
    assert streamed and all(c["prompt_token_ids"] is None and c["token_ids"] is None for c in streamed)


def test_a_later_delta_with_prompt_ids_adds_none_to_later_chunks():
    """A delta after the first that carries prompt ids again (a stream resumed from prompt + output ids) changes
    nothing: chat's ids stay on the first chunk, a completions choice keeps its own prompt's on its first."""
    from app.engine.interface import ChoiceDelta, GenerationDelta
    from app.openai.answers import Responder
    from app.openai.choice_shapes import ChatShape, CompletionShape

    def deltas() -> list[GenerationDelta]:
        return [GenerationDelta(choices=(ChoiceDelta(index=0, text="a", num_tokens=1, token_ids=(7,)),),
                                prompt_token_ids=(1, 2)),
                GenerationDelta(choices=(ChoiceDelta(index=0, text="b", num_tokens=1, token_ids=(8,)),),
                                prompt_token_ids=(1, 2, 7))]

    chat = Responder("c", "m", ChatShape(), 1, return_token_ids=True)
    first, later = (chunk_of(chat, d) for d in deltas())
    assert first is not None and later is not None
    assert first["prompt_token_ids"] == [1, 2] and "prompt_token_ids" not in later
    assert chat.full()["prompt_token_ids"] == [1, 2]
    completion = Responder("c", "m", CompletionShape(), 1, return_token_ids=True)
    first, later = (chunk_of(completion, d) for d in deltas())
    assert first is not None and later is not None
    assert first["choices"][0]["prompt_token_ids"] == [1, 2] and later["choices"][0]["prompt_token_ids"] is None
    assert completion.full()["choices"][0]["prompt_token_ids"] == [1, 2]

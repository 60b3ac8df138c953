"""`POST /v1/chat/completions/batch` (vLLM 0.32's batched chat) on the in-process stack: each conversation answered
as one choice, admitted whole, refused as vLLM refuses what it does not batch, and each conversation checked as a
chat request of its own."""

from __future__ import annotations

from app.engine.fake_model import ANSWER
from tests.support.fake_stack import MODEL_ID
from tests.unit.test_ingress import error_of

CONVERSATIONS = [[{"role": "user", "content": "Hello"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]]


async def test_each_conversation_is_one_choice_of_one_chat_completion(client):
    resp = await client.post("/v1/chat/completions/batch", json={"model": MODEL_ID, "messages": CONVERSATIONS,
                                                                 "max_tokens": 64})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["message"]["role"] == "assistant" and c["message"]["content"] == ANSWER for c in body["choices"])
    assert all(c["finish_reason"] == "stop" for c in body["choices"])
    one = (await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": CONVERSATIONS[1],
                                                           "max_tokens": 64})).json()
    alone = (await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": CONVERSATIONS[0],
                                                             "max_tokens": 64})).json()
    assert body["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"] + alone["usage"]["prompt_tokens"]


async def test_what_vllm_does_not_batch_is_refused_by_name(client):
    base = {"model": MODEL_ID, "messages": CONVERSATIONS}
    for extra, param in (({"stream": True}, "stream"), ({"n": 2}, "n"),
                         ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools")):
        err = error_of(await client.post("/v1/chat/completions/batch", json={**base, **extra}), 400)
        assert err["param"] == param and "Batch chat completions do not support" in err["message"]
    err = error_of(await client.post("/v1/chat/completions/batch", json={**base, "messages": [[]]}), 400)
    assert "messages" in str(err["param"])
    err = error_of(await client.post("/v1/chat/completions/batch", json={**base, "messages": CONVERSATIONS * 17}),
                   400)
    assert err["param"] == "messages" and "at most 32" in err["message"]


async def test_each_conversation_gets_the_chat_request_s_own_checks(client):
    body = {"model": MODEL_ID, "messages": [CONVERSATIONS[0], [{"role": "user", "content": "Go on"}]],
            "continue_final_message": True, "add_generation_prompt": False}
    err = error_of(await client.post("/v1/chat/completions/batch", json=body), 400)
    assert err["param"] == "continue_final_message"  # the final message is not the assistant's


async def test_each_choice_takes_its_own_conversation_s_role_and_echo_as_vllm_sets_them(client):
    """vLLM's batch_serving: with no generation prompt, a choice's role is its conversation's last message's, and
    `echo` starts it with that message's content."""
    conversations = [[*CONVERSATIONS[0], {"role": "assistant", "content": "The capital is"}], CONVERSATIONS[1]]
    resp = await client.post("/v1/chat/completions/batch", json={
        "model": MODEL_ID, "messages": conversations, "max_tokens": 64, "add_generation_prompt": False, "echo": True})
    assert resp.status_code == 200, resp.text
    messages = [c["message"] for c in resp.json()["choices"]]
    assert [m["role"] for m in messages] == ["assistant", "user"]
    assert messages[0]["content"] == "The capital is" + ANSWER
    assert messages[1]["content"] == "Hi there" + ANSWER


async def test_echo_without_a_generation_prompt_starts_with_the_last_message_whatever_its_role(client):
    resp = await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": CONVERSATIONS[1],
                                                           "max_tokens": 64, "add_generation_prompt": False,
                                                           "echo": True})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"] == {"role": "user", "content": "Hi there" + ANSWER}

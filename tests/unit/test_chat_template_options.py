"""vLLM's chat-template extensions on /v1/chat/completions (docs/api.md, "Chat templates"): `add_generation_prompt`,
`continue_final_message`, `chat_template_kwargs` reach the template; `echo` starts the answer with the final
assistant message; vLLM's refusals (both of the first two at once) and this service's bounds are 400s naming the
parameter. Against the fake engine, whose template is visible in its prompt tokens (app/engine/fake.py)."""

from __future__ import annotations

import json

import pytest

from app.config.model import LimitsConfig
from app.openai.chat import MAX_TEMPLATE_KWARGS_CHARS, ChatCompletionRequest
from tests.support import sse
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MODEL_ID, chat_body

OPEN_TURN = len("<|assistant|>")  # what the fake template adds for the generation prompt
STORY = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a time"}]


async def _prompt_tokens(client, **extra) -> int:
    r = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2, **extra))
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


async def _refused(client, param: str, **body) -> str:
    r = await client.post("/v1/chat/completions", json={"model": MODEL_ID, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    error = assert_error_shape(r.status_code, r.headers.get("content-type", ""), r.content)
    assert error["param"] == param, error
    return error["message"]


async def test_add_generation_prompt_false_leaves_the_assistant_turn_unopened(client):
    assert await _prompt_tokens(client) - await _prompt_tokens(client, add_generation_prompt=False) == OPEN_TURN


async def test_continue_final_message_leaves_the_final_message_open(client):
    r = await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": STORY, "max_tokens": 2,
                                                        "add_generation_prompt": False,
                                                        "continue_final_message": True})
    assert r.status_code == 200, r.text
    closed = await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": STORY,
                                                             "max_tokens": 2, "add_generation_prompt": False})
    assert r.json()["usage"]["prompt_tokens"] == closed.json()["usage"]["prompt_tokens"] - 1  # no closing newline


async def test_vllm_s_refusals_of_the_template_options(client):
    both = await _refused(client, "continue_final_message", messages=STORY, continue_final_message=True)
    assert "Cannot set both" in both  # add_generation_prompt defaults to true, as in vLLM
    await _refused(client, "continue_final_message", messages=[STORY[0]], continue_final_message=True,
                   add_generation_prompt=False)
    await _refused(client, "add_generation_prompt", messages=STORY, add_generation_prompt="sometimes")


async def test_chat_template_kwargs_reach_the_template_within_bounds(client):
    plain = await _prompt_tokens(client)
    assert await _prompt_tokens(client, chat_template_kwargs={"enable_thinking": False}) > plain
    for reserved in ("messages", "tools", "add_generation_prompt", "tokenize"):
        await _refused(client, "chat_template_kwargs", messages=STORY, chat_template_kwargs={reserved: 1})
    huge = {"note": "x" * (MAX_TEMPLATE_KWARGS_CHARS + 1)}
    await _refused(client, "chat_template_kwargs", messages=STORY, chat_template_kwargs=huge)
    await _refused(client, "chat_template_kwargs", messages=STORY, chat_template_kwargs=["not", "a", "map"])


@pytest.mark.parametrize("extra, expected", [
    ({"reasoning_effort": "low"}, {"reasoning_effort": "low", "enable_thinking": True}),
    ({"reasoning_effort": "none"}, {"reasoning_effort": "none", "enable_thinking": False}),
    # The request's own enable_thinking stays, as in vLLM.
    ({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}},
     {"reasoning_effort": "high", "enable_thinking": False}),
    ({}, {}),
])
def test_reasoning_effort_reaches_the_template_as_vllm_passes_it(extra, expected):
    request = ChatCompletionRequest.model_validate({"model": MODEL_ID, "messages": STORY[:1], **extra})
    assert dict(request.to_prompt(LimitsConfig()).template_kwargs) == expected


async def test_reasoning_effort_is_answered_and_a_bad_one_refused(client):
    assert await _prompt_tokens(client, reasoning_effort="low") > await _prompt_tokens(client)
    await _refused(client, "reasoning_effort", messages=STORY, reasoning_effort="extreme")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_echo_starts_the_answer_with_the_final_assistant_message(client, stream):
    body = {"model": MODEL_ID, "messages": STORY, "max_tokens": 3, "add_generation_prompt": False,
            "continue_final_message": True, "echo": True, "stream": stream}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    if stream:
        events = [e for e in sse.parse(r.text) if e != "[DONE]"]
        content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    else:
        content = r.json()["choices"][0]["message"]["content"]
    assert content.startswith("Once upon a time") and len(content) > len("Once upon a time")
    # The final message is the user's: nothing to echo (vLLM's rule).
    r = await client.post("/v1/chat/completions", json=chat_body("Tell me a story.", max_tokens=3, echo=True))
    assert not r.json()["choices"][0]["message"]["content"].startswith("Tell me")
    assert json.loads(r.text)["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("max_tokens", [None, 3], ids=["default-length", "cut-short"])
async def test_echo_leaves_the_finish_reason_the_engines(client, stream, max_tokens):
    """Issue 26: `continue_final_message` with `echo` ends as the same request without `echo` ends, and as the
    engine ended it (`stop` when the model stopped, `length` at max_tokens): the echoed text is not output and
    counts against nothing. (vLLM's `stop` where this service said `length` came from the default max_tokens:
    vLLM's is the context left, this service's `limits.default_max_tokens`; docs/api.md.)"""
    async def finish(echo: bool) -> str | None:
        body = {"model": MODEL_ID, "messages": STORY, "add_generation_prompt": False,
                "continue_final_message": True, "echo": echo, "stream": stream}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        if not stream:
            return r.json()["choices"][0]["finish_reason"]
        events = [e for e in sse.parse(r.text) if e != "[DONE]" and e.get("choices")]
        return next(e["choices"][0]["finish_reason"] for e in reversed(events))

    expected = "stop" if max_tokens is None else "length"  # the fake answer's 9 words fit the default (32)
    assert await finish(echo=True) == await finish(echo=False) == expected

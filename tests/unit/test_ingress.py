"""The HTTP API end to end in-process: FastAPI app -> EngineHost -> FakeEngine, via httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from app.api_keys import API_KEYS_ENV
from app.engine.fake import FakeEngine
from app.engine.fake_model import ANSWER
from app.errors import InvalidRequest
from app.host.replica_load import ReplicaLoad
from app.http.capacity import Capacity
from app.http.ingress_state import IngressState
from app.http.lifecycle import Lifecycle
from app.http.metrics import Metrics
from tests.support import sse
from tests.support.fake_stack import (
    MAX_MODEL_LEN,
    MAX_TOKENS,
    MODEL_ID,
    chat_body,
    listening,
    make_config,
    usage_of,
)
from tests.support.waiting import until

ERROR_KEYS = {"message", "type", "param", "code"}


def error_of(resp: httpx.Response, status: int) -> dict:
    """Assert `resp` is an OpenAI-shaped error with `status`; return its error object."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body  # never FastAPI's {"detail": ...}
    assert set(body["error"]) == ERROR_KEYS, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def events(resp: httpx.Response) -> list:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    return sse.parse(resp.text)


class DyingEngine(FakeEngine):
    """Dies (kill()) after it has produced `after` deltas of a request."""

    def __init__(self, after: int, **kw):
        super().__init__(**kw)
        self.after = after

    async def generate(self, request_id, prompt_token_ids, params):
        count = 0
        async for delta in super().generate(request_id, prompt_token_ids, params):
            yield delta
            count += 1
            if count == self.after:
                self.kill()


# -- models ---------------------------------------------------------------------------

async def test_list_models(client):
    resp = await client.get("/v1/models")
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL_ID]
    assert body["data"][0]["object"] == "model"
    assert body["data"][0]["max_model_len"] == MAX_MODEL_LEN


async def test_get_model(client):
    resp = await client.get(f"/v1/models/{MODEL_ID}")
    assert resp.status_code == 200 and resp.json()["id"] == MODEL_ID
    card = resp.json()  # the fields of vLLM's ModelCard, which its clients read
    assert set(card) == {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
    assert card["created"] > 0 and card["owned_by"] == "vllm" and card["parent"] is None and card["root"]
    assert card["permission"][0]["object"] == "model_permission" and card["permission"][0]["allow_sampling"]
    err = error_of(await client.get("/v1/models/nope"), 404)
    assert err["code"] == "model_not_found"


# -- chat completions ---------------------------------------------------------------------

async def test_chat_non_stream_shape(client, stack):
    resp = await client.post("/v1/chat/completions", json=chat_body("Hi"))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and body["created"] > 0
    assert body["model"] == MODEL_ID
    assert len(body["choices"]) == 1
    choice = body["choices"][0]
    assert choice["index"] == 0
    assert choice["message"] == {"role": "assistant", "content": ANSWER}
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    prompt_tokens = len(stack.engine.render_chat([{"role": "user", "content": "Hi"}]))
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["completion_tokens"] == len(ANSWER.split(" "))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_chat_n_and_max_tokens(client):
    body = (await client.post("/v1/chat/completions", json=chat_body(n=2, max_tokens=3, temperature=0.7))).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 6


async def test_chat_logprobs(client):
    resp = await client.post("/v1/chat/completions", json=chat_body(logprobs=True, top_logprobs=2, max_tokens=2))
    body = resp.json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 2
    assert set(content[0]) == {"token", "logprob", "bytes", "top_logprobs"}
    assert len(content[0]["top_logprobs"]) == 2


async def test_chat_stream(client):
    resp = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    out = events(resp)
    assert out[-1] == "[DONE]"
    chunks = out[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == ANSWER
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in chunks)


async def test_chat_stream_include_usage(client):
    resp = await client.post("/v1/chat/completions",
                             json=chat_body(stream=True, stream_options={"include_usage": True}))
    out = events(resp)
    assert out[-1] == "[DONE]"
    *content_chunks, usage_chunk = out[:-1]
    assert all(c["usage"] is None for c in content_chunks)
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == len(ANSWER.split(" "))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_stream_error_before_start_is_plain_http_error(client):
    resp = await client.post("/v1/chat/completions", json=chat_body(stream=True, max_tokens=10_000))
    assert error_of(resp, 400)["param"] == "max_tokens"


async def test_stream_error_after_start_is_error_event_then_done(make_stack):
    stack = make_stack(engine=DyingEngine(after=2, max_model_len=MAX_MODEL_LEN))
    resp = await stack.client.post("/v1/chat/completions", json=chat_body(stream=True, max_tokens=50, ignore_eos=True))
    out = events(resp)
    assert out[-1] == "[DONE]"
    error = out[-2]
    assert set(error) == {"error"} and set(error["error"]) == ERROR_KEYS
    assert error["error"]["code"] == "engine_unavailable"
    assert len(out) >= 4 and all("choices" in c for c in out[:-2])  # content came out before the failure
    assert stack.engine.dead
    assert stack.engine.running == set()
    assert stack.host.admission.stats().in_system == 0


class BrokenEngine(FakeEngine):
    """Fails with an unexpected (non-service) error after `after` deltas."""

    def __init__(self, after: int, **kw):
        super().__init__(**kw)
        self.after = after

    async def generate(self, request_id, prompt_token_ids, params):
        count = 0
        async for delta in super().generate(request_id, prompt_token_ids, params):
            if count == self.after:
                raise RuntimeError("boom")
            yield delta
            count += 1


async def test_unexpected_error_is_500_in_openai_shape(make_stack):
    stack = make_stack(engine=BrokenEngine(after=0, max_model_len=MAX_MODEL_LEN))
    transport = httpx.ASGITransport(app=stack.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        resp = await client.post("/v1/chat/completions", json=chat_body())
    err = error_of(resp, 500)
    assert err["type"] == "internal_error"
    assert "boom" not in err["message"]  # internals stay in the log
    assert stack.host.admission.stats().in_system == 0


async def test_unexpected_error_mid_stream_is_error_event_then_done(make_stack):
    stack = make_stack(engine=BrokenEngine(after=2, max_model_len=MAX_MODEL_LEN))
    out = events(await stack.client.post("/v1/chat/completions", json=chat_body(stream=True)))
    assert out[-1] == "[DONE]"
    assert out[-2]["error"]["type"] == "internal_error"
    assert len(out) == 4  # two content chunks, the error, [DONE]
    assert stack.host.admission.stats().in_system == 0
    assert stack.engine.running == set()


# -- completions ---------------------------------------------------------------------------

async def test_completion(client):
    body = (await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Say", "max_tokens": 4})).json()
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["text"] == " ".join(ANSWER.split(" ")[:4]) + " "
    assert choice["finish_reason"] == "length"
    assert body["usage"] == usage_of(3, 4)


async def test_completion_echo(client):
    body = (await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Say: ", "echo": True})).json()
    assert body["choices"][0]["text"] == "Say: " + ANSWER


async def test_completion_echo_token_ids(client):
    ids = list("héllo".encode())
    resp = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": ids, "echo": True, "max_tokens": 1})
    body = resp.json()
    assert body["choices"][0]["text"].startswith("héllo")
    assert body["usage"]["prompt_tokens"] == len(ids)


async def test_completion_echo_stream(client):
    body = {"model": MODEL_ID, "prompt": "Q ", "echo": True, "stream": True}
    out = events(await client.post("/v1/completions", json=body))
    assert out[-1] == "[DONE]"
    assert out[0]["choices"][0]["text"].startswith("Q ")
    assert "".join(c["choices"][0]["text"] for c in out[:-1]) == "Q " + ANSWER
    # vLLM's: a streamed echo carries the prompt's ids on the first chunk, unasked (and the output's ids never)
    ids = [c["choices"][0]["prompt_token_ids"] for c in out[:-1]]
    assert ids[0] == list(b"Q ") and not any(ids[1:])
    assert all(c["choices"][0]["token_ids"] is None for c in out[:-1])
    whole = (await client.post("/v1/completions", json={**body, "stream": False})).json()["choices"][0]
    assert whole["prompt_token_ids"] is None and whole["text"] == "Q " + ANSWER


async def test_completion_batch_over_its_bound_refused(client):
    err = error_of(await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": ["a"] * 33}), 400)
    assert err["param"] == "prompt"


# -- request errors ------------------------------------------------------------------------

async def test_unknown_model_404(client):
    err = error_of(await client.post("/v1/chat/completions", json={**chat_body(), "model": "nope"}), 404)
    assert err["code"] == "model_not_found"
    assert err["param"] == "model"
    assert "nope" in err["message"]


@pytest.mark.parametrize("model", [None, ""])
async def test_a_request_without_a_model_is_served_by_the_one_model_as_vllm_serve_does(client, model):
    def body(**fields):
        return {**fields, "model": model} if model is not None else fields

    chat = (await client.post("/v1/chat/completions", json=body(messages=[{"role": "user", "content": "Hi"}])))
    assert chat.status_code == 200 and chat.json()["model"] == MODEL_ID, chat.text
    completion = await client.post("/v1/completions", json=body(prompt="Hi", max_tokens=2))
    assert completion.status_code == 200 and completion.json()["model"] == MODEL_ID, completion.text
    response = await client.post("/v1/responses", json=body(input="Hi"))
    assert response.status_code == 200 and response.json()["model"] == MODEL_ID, response.text
    tokens = await client.post("/tokenize", json=body(prompt="Hi"))
    assert tokens.status_code == 200 and tokens.json()["tokens"], tokens.text
    text = await client.post("/detokenize", json=body(tokens=tokens.json()["tokens"]))
    assert text.status_code == 200 and text.json()["prompt"] == "Hi", text.text


def test_a_request_without_a_model_names_the_choices_when_several_are_served():
    one = make_config().models[0]
    config = make_config().model_copy(update={"models": [one, one.model_copy(update={"id": "other"})]})
    state = IngressState(config, {MODEL_ID: object(), "other": object()}, Metrics(), Capacity(config), Lifecycle(),
                         False)
    assert state.backend_for("other")[0].id == "other"
    with pytest.raises(InvalidRequest) as refused:
        state.backend_for(None)
    assert refused.value.param == "model" and f"({MODEL_ID}, other)" in refused.value.message


async def test_malformed_json_400(client):
    resp = await client.post("/v1/chat/completions", content=b'{"model": "x", "messages": [',
                             headers={"content-type": "application/json"})
    err = error_of(resp, 400)
    assert err["type"] == "invalid_request_error"
    assert "JSON" in err["message"]


async def test_missing_body_400(client):
    err = error_of(await client.post("/v1/chat/completions"), 400)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param", [
    (chat_body(temperature="hot"), "temperature"),
    ({"model": MODEL_ID, "messages": "hi"}, "messages"),
    ({"model": MODEL_ID}, "messages"),
    (chat_body(n=0), "n"),
    (chat_body(max_tokens=10_000), "max_tokens"),
    (chat_body(n=2, temperature=0), "n"),
    (chat_body(stop=["a", "b", "c"]), "stop"),
    (chat_body(top_logprobs=1), "top_logprobs"),
    (chat_body(foo=1), "foo"),
    (chat_body(tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice"),  # "auto": no parser here
])
async def test_bad_requests_name_the_param(client, body, param):
    err = error_of(await client.post("/v1/chat/completions", json=body), 400)
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"


async def test_unknown_field_message(client):
    err = error_of(await client.post("/v1/chat/completions", json=chat_body(foo=1)), 400)
    assert err["message"] == "Unrecognized request argument supplied: foo"


async def test_ignored_and_empty_tool_fields_accepted(client):
    body = chat_body(user="u", tool_choice="none", metadata={"a": "b"})
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text


def _seen_by_the_host(stack, monkeypatch, what) -> list:
    """`what` of each engine request the stack's host is given, in order."""
    seen: list = []
    generate = stack.host.generate

    def recording(request, client=None):
        seen.append(what(request))
        return generate(request, client)

    monkeypatch.setattr(stack.host, "generate", recording)
    return seen


@pytest.mark.parametrize("headers, body, hint", [
    ({}, {"prompt_cache_key": "conv-7"}, "conv-7"),  # OpenAI's parameter, as agent frameworks send it
    ({"X-Session-Id": "s-1"}, {"prompt_cache_key": "conv-7"}, "s-1"),  # the header wins
    ({}, {}, ""),
])
async def test_the_routing_hint_reaches_the_engine_request(stack, monkeypatch, headers, body, hint):
    seen = _seen_by_the_host(stack, monkeypatch, lambda request: request.session_id)
    resp = await stack.client.post("/v1/chat/completions", json=chat_body(**body), headers=headers)
    assert resp.status_code == 200, resp.text
    resp = await stack.client.post("/v1/responses", json={"model": MODEL_ID, "input": "Hi", **body}, headers=headers)
    assert resp.status_code == 200, resp.text
    assert seen == [hint, hint]


@pytest.mark.parametrize("headers, body, hint", [
    ({}, {"session_id": "vllm-9"}, "vllm-9"),  # vLLM's parameter
    ({}, {"session_id": "vllm-9", "prompt_cache_key": "conv-7"}, "vllm-9"),
    ({"X-Session-Id": "s-1"}, {"session_id": "vllm-9"}, "s-1"),
])
async def test_vllm_s_session_id_is_the_routing_hint_too(stack, monkeypatch, headers, body, hint):
    seen = _seen_by_the_host(stack, monkeypatch, lambda request: request.session_id)
    resp = await stack.client.post("/v1/chat/completions", json=chat_body(**body), headers=headers)
    assert resp.status_code == 200, resp.text
    resp = await stack.client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2,
                                                            **body}, headers=headers)
    assert resp.status_code == 200, resp.text
    assert seen == [hint, hint]


async def test_vllm_s_extensions_for_what_is_not_run_here_are_refused_by_name(client):
    assert (await client.post("/v1/chat/completions", json=chat_body(include_reasoning=False))).status_code == 200
    for name, value in (("vllm_xargs", {"a": 1}), ("repetition_detection", {"max_pattern_size": 4}),
                        ("kv_transfer_params", {"do_remote_decode": True}), ("chat_template", "{{ messages }}")):
        err = error_of(await client.post("/v1/chat/completions", json=chat_body(**{name: value})), 400)
        assert err["code"] == "unsupported_parameter" and err["param"] == name and "not supported" in err["message"]


async def test_a_cache_salt_reaches_the_engine_and_a_bad_one_is_refused_in_vllm_s_words(stack, monkeypatch):
    seen = _seen_by_the_host(stack, monkeypatch, lambda request: request.params.cache_salt)
    salt = "k" * 43
    for path, body in (("/v1/chat/completions", chat_body(cache_salt=salt)),
                       ("/v1/completions", {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2, "cache_salt": salt}),
                       ("/v1/responses", {"model": MODEL_ID, "input": "Hi", "cache_salt": salt})):
        resp = await stack.client.post(path, json=body)
        assert resp.status_code == 200, resp.text
    assert seen == [salt, salt, salt]
    for bad, words in (("", "non-empty"), ("a/b", "at most 128 characters"), ("s" * 129, "at most 128 characters")):
        err = error_of(await stack.client.post("/v1/chat/completions", json=chat_body(cache_salt=bad)), 400)
        assert err["param"] == "cache_salt" and words in err["message"]


async def test_context_length_exceeded_400(client):
    err = error_of(await client.post("/v1/chat/completions", json=chat_body("x" * 200, max_tokens=100)), 400)
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == "messages"
    assert err["message"].startswith(f"This model's maximum context length is {MAX_MODEL_LEN} tokens.")


async def test_invalid_json_schema_400(client):
    body = chat_body(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": 12}}})
    err = error_of(await client.post("/v1/chat/completions", json=body), 400)
    assert err["param"] == "response_format"


async def test_unknown_route_404(client):
    err = error_of(await client.get("/v1/nothing-here"), 404)
    assert err["code"] == "not_found"
    assert "did you mean" not in err["message"]


@pytest.mark.parametrize(("path", "meant"), [("/chat/completions", "/v1/chat/completions"),
                                             ("/v1/v1/chat/completions", "/v1/chat/completions"),
                                             ("/v1/tokenize", "/tokenize")])
async def test_a_route_missing_or_doubling_v1_is_named_in_the_404(client, path, meant):
    err = error_of(await client.post(path, json=chat_body()), 404)
    assert err["code"] == "not_found" and f"did you mean {meant}?" in err["message"]
    assert ("base URL ends in /v1" in err["message"]) == meant.startswith("/v1/")


async def test_wrong_method_405(client):
    err = error_of(await client.get("/v1/chat/completions"), 405)
    assert err["code"] == "method_not_allowed"
    for path in ("/v1/models", "/health"):  # a POST without a body's type to a GET route: the method is what's wrong
        assert error_of(await client.post(path), 405)["code"] == "method_not_allowed"


async def test_body_too_large_413(make_stack):
    stack = make_stack(make_config(service={"max_body_bytes": 2048}))
    err = error_of(await stack.client.post("/v1/chat/completions", json=chat_body("x" * 5000)), 413)
    assert err["code"] == "request_too_large"


async def test_body_too_large_without_content_length_413(make_stack):
    stack = make_stack(make_config(service={"max_body_bytes": 2048}))
    payload = json.dumps(chat_body("x" * 5000)).encode()

    async def chunks():
        for i in range(0, len(payload), 1000):
            yield payload[i:i + 1000]

    resp = await stack.client.post("/v1/chat/completions", content=chunks(),
                                   headers={"content-type": "application/json"})
    assert "content-length" not in resp.request.headers
    err = error_of(resp, 413)
    assert err["code"] == "request_too_large"


async def test_other_http_errors_keep_their_status(stack):
    from fastapi import HTTPException

    async def conflict():
        raise HTTPException(status_code=409, detail="already there")

    stack.app.add_api_route("/conflict", conflict)
    err = error_of(await stack.client.get("/conflict"), 409)
    assert err["message"] == "already there"
    assert err["type"] == "invalid_request_error"


async def test_body_under_limit_ok(make_stack):
    stack = make_stack(make_config(service={"max_body_bytes": 2048}))
    resp = await stack.client.post("/v1/chat/completions", json=chat_body("x" * 100))
    assert resp.status_code == 200, resp.text


# -- API keys, request ids -------------------------------------------------------------------

@pytest.fixture
def keyed(make_stack, monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    return make_stack(make_config(service={"api_keys": ["sk-right"]}))


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-right"},
                                     {"Authorization": "Basic sk-right"}, {"Authorization": "Bearer "}])
async def test_api_key_refused(keyed, headers):
    for resp in (await keyed.client.post("/v1/chat/completions", json=chat_body(), headers=headers),
                 await keyed.client.get("/v1/models", headers=headers)):
        err = error_of(resp, 401)
        assert err["type"] == "authentication_error"


async def test_api_key_accepted_and_health_open(keyed):
    resp = await keyed.client.post("/v1/chat/completions", json=chat_body(),
                                   headers={"Authorization": "Bearer sk-right"})
    assert resp.status_code == 200, resp.text
    assert (await keyed.client.get("/v1/models", headers={"Authorization": "bearer sk-right"})).status_code == 200
    assert (await keyed.client.get("/health")).status_code == 200
    assert (await keyed.client.get("/livez")).status_code == 200


async def test_api_key_from_env(make_stack, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, "sk-env")
    stack = make_stack(make_config())
    assert (await stack.client.get("/v1/models")).status_code == 401
    assert (await stack.client.get("/v1/models", headers={"Authorization": "Bearer sk-env"})).status_code == 200


async def test_request_id_echoed(client):
    resp = await client.get("/v1/models", headers={"X-Request-Id": "my-id-123"})
    assert resp.headers["x-request-id"] == "my-id-123"
    resp = await client.post("/v1/chat/completions", json=chat_body(), headers={"X-Request-Id": "chat-id"})
    assert resp.headers["x-request-id"] == "chat-id"


async def test_request_id_generated(client):
    first = (await client.get("/v1/models")).headers["x-request-id"]
    second = (await client.get("/v1/models")).headers["x-request-id"]
    assert first and second and first != second


async def test_request_id_on_errors(keyed):
    resp = await keyed.client.get("/v1/models", headers={"X-Request-Id": "denied-1"})
    assert resp.status_code == 401
    assert resp.headers["x-request-id"] == "denied-1"


async def test_an_answer_is_named_as_vllm_names_it_the_header_before_the_body_s_request_id(client):
    named = chat_body(request_id="order-7")
    assert (await client.post("/v1/chat/completions", json=named)).json()["id"] == "chatcmpl-order-7"
    headed = await client.post("/v1/chat/completions", json=named, headers={"X-Request-Id": "trace-9"})
    assert headed.json()["id"] == "chatcmpl-trace-9"
    completion = {"model": MODEL_ID, "prompt": "hi", "max_tokens": 3, "request_id": "c1", "stream": True}
    chunks = events(await client.post("/v1/completions", json=completion))
    assert {c["id"] for c in chunks if isinstance(c, dict)} == {"cmpl-c1"}
    unnamed = (await client.post("/v1/chat/completions", json=chat_body())).json()["id"]
    assert unnamed.startswith("chatcmpl-") and len(unnamed) > len("chatcmpl-")


async def test_two_answers_named_alike_are_both_served_whole(client):
    # The engine requests keep ids of their own: the same name twice at once is two requests, not one.
    body = chat_body(request_id="same", max_tokens=8)
    both = await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(2)))
    assert [r.status_code for r in both] == [200, 200], [r.text for r in both]
    assert [r.json()["id"] for r in both] == ["chatcmpl-same"] * 2
    assert all(r.json()["choices"][0]["finish_reason"] for r in both)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", chat_body(request_id="x" * 129), "request_id"),
    ("/v1/chat/completions", chat_body(request_id=""), "request_id"),
    ("/v1/chat/completions", chat_body(add_special_tokens=True), "add_special_tokens"),
    ("/v1/completions", {"model": MODEL_ID, "prompt": "hi", "add_special_tokens": False}, "add_special_tokens"),
])
async def test_a_request_id_or_special_tokens_not_served_are_refused_by_name(client, path, body, param):
    assert error_of(await client.post(path, json=body), 400)["param"] == param


async def test_vllm_s_default_add_special_tokens_is_served(client):
    chat = await client.post("/v1/chat/completions", json=chat_body(add_special_tokens=False))
    completion = await client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "hi", "max_tokens": 2,
                                                              "add_special_tokens": True})
    assert (chat.status_code, completion.status_code) == (200, 200), (chat.text, completion.text)


# -- tokenize, health, stats -------------------------------------------------------------------

async def test_tokenize_detokenize_round_trip(client):
    resp = await client.post("/tokenize", json={"model": MODEL_ID, "prompt": "héllo wörld"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["count"] == len(body["tokens"]) == len("héllo wörld".encode())
    assert body["max_model_len"] == MAX_MODEL_LEN
    resp = await client.post("/detokenize", json={"model": MODEL_ID, "tokens": body["tokens"]})
    assert resp.status_code == 200
    assert resp.json() == {"prompt": "héllo wörld"}


async def test_tokenize_messages_matches_chat_usage(client):
    messages = [{"role": "user", "content": "Hi"}]
    count = (await client.post("/tokenize", json={"model": MODEL_ID, "messages": messages})).json()["count"]
    usage = (await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": messages})).json()["usage"]
    assert count == usage["prompt_tokens"]


async def test_tokenize_takes_the_chat_template_options_vllm_s_takes(client):
    """With `tools`, `add_generation_prompt`, `continue_final_message` and `chat_template_kwargs` (vLLM's /tokenize
    takes them), the count is what the same chat request's prompt costs."""
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

    async def count(**options):
        r = await client.post("/tokenize", json={"model": MODEL_ID, "messages": messages, **options})
        assert r.status_code == 200, r.text
        return r.json()["count"]

    chat = await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": messages, "tools": tools,
                                                           "tool_choice": "none", "max_tokens": 1})
    assert await count(tools=tools) == chat.json()["usage"]["prompt_tokens"] > await count()
    assert await count(add_generation_prompt=False) < await count()
    assert await count(add_special_tokens=False, return_token_strs=False) == await count()  # vLLM's defaults


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL_ID, "prompt": "a", "return_token_strs": True}, "return_token_strs"),
    ({"model": MODEL_ID, "messages": [{"role": "user", "content": "b"}], "add_special_tokens": True},
     "add_special_tokens"),
    ({"model": MODEL_ID, "prompt": "a", "add_special_tokens": False}, "add_special_tokens"),
    ({"model": MODEL_ID, "prompt": "a", "tools": []}, "tools"),
    ({"model": MODEL_ID, "prompt": "a", "add_generation_prompt": False}, "add_generation_prompt"),
    ({"model": MODEL_ID, "messages": [{"role": "user", "content": "b"}], "chat_template_kwargs": {"tools": 1}},
     "chat_template_kwargs"),
])
async def test_tokenize_refuses_an_option_it_does_not_apply_naming_it(client, body, param):
    assert error_of(await client.post("/tokenize", json=body), 400)["param"] == param


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL_ID}, "prompt"),
    ({"model": MODEL_ID, "prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
    ({"model": MODEL_ID, "prompt": ""}, "prompt"),
])
async def test_tokenize_bad_requests(client, body, param):
    assert error_of(await client.post("/tokenize", json=body), 400)["param"] == param


async def test_tokenize_bad_messages_400(client):
    for messages in ([{"role": "", "content": "x"}], []):
        err = error_of(await client.post("/tokenize", json={"model": MODEL_ID, "messages": messages}), 400)
        assert err["param"] == "messages"


async def test_tokenize_unknown_model_404(client):
    resp = await client.post("/tokenize", json={"model": "nope", "prompt": "a"})
    assert error_of(resp, 404)["code"] == "model_not_found"


async def test_detokenize_negative_tokens_400(client):
    resp = await client.post("/detokenize", json={"model": MODEL_ID, "tokens": [1, -1]})
    assert error_of(resp, 400)["param"] == "tokens"


async def test_health(client, stack):
    resp = await client.get("/health")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "models": {MODEL_ID: True}}
    stack.engine.kill()
    resp = await client.get("/health")
    assert resp.status_code == 503
    assert resp.json() == {"status": "unavailable", "models": {MODEL_ID: False}}
    err = error_of(await client.post("/v1/chat/completions", json=chat_body()), 503)
    assert err["code"] == "engine_unavailable"


async def test_dead_engine_503_has_retry_after(client, stack):
    stack.engine.kill()
    resp = await client.post("/v1/chat/completions", json=chat_body())
    error_of(resp, 503)
    assert int(resp.headers["retry-after"]) >= 1


async def test_stats(client):
    await client.post("/v1/chat/completions", json=chat_body())
    body = (await client.get("/stats")).json()
    assert body[MODEL_ID]["admission"]["in_system"] == 0
    assert body[MODEL_ID]["engine"]["generation_tokens_total"] == len(ANSWER.split(" "))


# -- overload -------------------------------------------------------------------------------

async def test_queue_full_429_with_retry_after(make_stack):
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 1})
    stack = make_stack(config, FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.05))
    # five at once against one slot and one queue place; the one served holds its slot for 9 tokens of 50 ms
    responses = await asyncio.gather(*(stack.client.post("/v1/chat/completions", json=chat_body(f"q{i}"))
                                       for i in range(5)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 429, 429, 429], statuses
    for resp in responses:
        if resp.status_code == 429:
            err = error_of(resp, 429)
            assert (err["type"], err["code"]) == ("rate_limit_error", "queue_full")
            assert int(resp.headers["retry-after"]) >= 1
        else:
            assert resp.json()["choices"][0]["message"]["content"] == ANSWER
    assert stack.host.admission.stats().in_system == 0


async def test_a_full_model_s_refusal_at_the_front_door_says_when_a_place_frees(make_stack):
    """The front door refuses a full model before reading the body; its Retry-After is the replica's own prediction of
    when a place frees (here the running stream's end, seconds away), not a flat second that a client (the SDKs
    retry a queue_full by themselves) would spend on another 429."""
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0})
    stack = make_stack(config, FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.05))
    for i in range(5):  # the replica learns its pace (and that requests run to max_tokens) from its first ones
        warm = chat_body(f"warm {i}", max_tokens=8, ignore_eos=True)
        assert (await stack.client.post("/v1/chat/completions", json=warm)).status_code == 200
    long = chat_body("long", stream=True, max_tokens=MAX_TOKENS, ignore_eos=True)  # 6.4 s of tokens at 50 ms
    async with listening(stack) as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        async with client.stream("POST", "/v1/chat/completions", json=long) as running:
            assert running.status_code == 200
            lines = running.aiter_lines()
            while not (await anext(lines)).startswith("data: {"):
                pass
            refused = await client.post("/v1/chat/completions", json=chat_body("refused"))
    assert error_of(refused, 429)["code"] == "queue_full"
    assert int(refused.headers["retry-after"]) >= 3, refused.headers  # the long stream had ~6 s to run
    await until(lambda: stack.host.admission.stats().in_system == 0, what="the long stream's place given back")


def test_the_front_door_s_retry_after_is_the_soonest_place_a_serving_replica_predicts():
    class Fleet:  # a backend as the ingress sees its replicas (rayserve/handle_backend.py: their last reports)
        def __init__(self, *loads: ReplicaLoad):
            self._loads = list(loads)

        def loads(self) -> list[ReplicaLoad]:
            return self._loads

    config = make_config()
    fleet = Fleet(ReplicaLoad(room=0, free_in_s=12.0), ReplicaLoad(room=0, free_in_s=4.0),
                  ReplicaLoad(serving=False, room=0, free_in_s=0.5))  # a stopping replica frees nothing
    state = IngressState(config, {MODEL_ID: fleet}, Metrics(), Capacity(config), Lifecycle(), False)
    assert state.retry_after_s(MODEL_ID) == 4.0 and not state.has_room()
    fleet._loads.append(ReplicaLoad(room=3, wait_s=0.2))
    assert state.has_room()
    fleet._loads[:] = []  # none reported yet: a second, and no room known
    assert state.retry_after_s(MODEL_ID) == 1.0 and not state.has_room()


async def test_queue_full_503_when_configured(make_stack):
    config = make_config(service={"refusal_status": 503},
                         deployment={"max_ongoing_requests": 1, "max_queued_requests": 0})
    stack = make_stack(config, FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.02))
    responses = await asyncio.gather(*(stack.client.post("/v1/chat/completions", json=chat_body()) for _ in range(3)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 503, 503], statuses
    refused = next(r for r in responses if r.status_code == 503)
    assert error_of(refused, 503)["code"] == "queue_full"
    assert "retry-after" in refused.headers


async def test_draining_refuses_with_503(client, stack):
    stack.app.state.ingress.lifecycle.draining = True
    err = error_of(await client.get("/v1/models"), 503)
    assert err["type"] == "service_unavailable"
    assert (await client.get("/livez")).status_code == 200


async def test_a_repeated_prompt_reports_its_cached_tokens_in_usage_and_metrics(make_stack):
    """vLLM's prefix cache made visible: usage.prompt_tokens_details.cached_tokens (OpenAI's field) with
    `service.enable_prompt_tokens_details` (vLLM's --enable-prompt-tokens-details), streamed and not, and vLLM's
    prefix-cache counters in /metrics."""
    client = make_stack(config=make_config(service={"enable_prompt_tokens_details": True})).client
    body = chat_body("a prompt long enough to span several blocks of the prefix cache, sent twice", max_tokens=2)
    first = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    again = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < again["prompt_tokens"] and cached % 16 == 0
    streamed = events(await client.post("/v1/chat/completions", json={
        **body, "stream": True, "stream_options": {"include_usage": True}}))
    usage = next(e["usage"] for e in streamed if isinstance(e, dict) and e.get("usage"))
    assert usage["prompt_tokens_details"]["cached_tokens"] == cached
    metrics = (await client.get("/metrics")).text
    hits = [ln for ln in metrics.splitlines() if ln.startswith("vllm:prefix_cache_hits_total{")]
    assert hits and float(hits[0].rsplit(" ", 1)[1]) >= 2 * cached


async def test_a_custom_role_is_served_as_vllm_serves_it(client):
    """Issue 26: vLLM passes any role string to the chat template; a role outside OpenAI's five is no 400 here."""
    r = await client.post("/v1/chat/completions", json={"model": MODEL_ID, "max_tokens": 4, "messages": [
        {"role": "user_custom", "content": "Hello"}, {"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    r = await client.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": [{"role": "", "content": "x"}]})
    assert error_of(r, 400)["param"] is not None

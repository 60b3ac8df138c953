"""Hand-written hostile requests against the in-process app (FastAPI -> EngineHost -> FakeEngine).

Every case must end in a client error in the OpenAI shape that names the parameter where
there is one, never a 5xx, a 422 or a hang; and the app must answer a normal request right
after it. The same list is sent once to the real stack by tests/integration/test_fuzz_real.py
(`hostile_cases(model)` builds it for any model id), so it must not depend on the fake engine.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from app.fake_engine import FakeEngine

try:  # as a unit test module, tests/unit is on sys.path
    from unit_support import MODEL_ID
except ImportError:  # imported by the integration suite for `hostile_cases` only
    MODEL_ID = "fake-model"

ERROR_KEYS = {"message", "type", "param", "code"}
ANY_PARAM = object()  # the error may name any parameter, or none
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
CASE_TIMEOUT_S = 30  # a hostile request that takes longer than this has hung the app


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    body: bytes
    statuses: tuple[int, ...] = (400,)  # acceptable statuses; a 4xx among them must be OpenAI-shaped
    param: Any = ANY_PARAM  # the parameter a 4xx must name (None: must name none)
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False  # send without Content-Length, in chunks
    server_level: bool = False  # the HTTP server itself may refuse it (real stack): any non-5xx, any shape
    over_http: bool = True  # False: an HTTP client library will not send it (e.g. a lying Content-Length)

    def __repr__(self) -> str:  # keeps pytest ids and failure messages short
        return f"Hostile({self.name})"


def _j(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def _chat(model: str, content: Any = "Hello", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _nested(depth: int, opening: str, closing: str, leaf: str) -> str:
    return opening * depth + leaf + closing * depth


# Wrong JSON types, one parameter at a time: (path, parameter, value).
WRONG_TYPES: list[tuple[str, str, Any]] = [
    (CHAT, "model", 5), (CHAT, "model", None), (CHAT, "messages", "Hello"), (CHAT, "messages", {"role": "user"}),
    (CHAT, "temperature", "hot"), (CHAT, "top_p", []), (CHAT, "n", "many"), (CHAT, "n", 1.5),
    (CHAT, "max_tokens", {"a": 1}), (CHAT, "max_tokens", 2.5), (CHAT, "max_completion_tokens", "x"),
    (CHAT, "stop", 5), (CHAT, "stop", [None]), (CHAT, "seed", "x"), (CHAT, "seed", 0.5),
    (CHAT, "presence_penalty", "x"), (CHAT, "frequency_penalty", []), (CHAT, "stream", "maybe"),
    (CHAT, "stream_options", 5), (CHAT, "ignore_eos", {}), (CHAT, "logprobs", "x"), (CHAT, "top_logprobs", "x"),
    (CHAT, "response_format", "json"), (CHAT, "response_format", {"type": 5}),
    (COMPLETIONS, "prompt", 5), (COMPLETIONS, "prompt", {"text": "x"}), (COMPLETIONS, "prompt", [[1, 2]]),
    (COMPLETIONS, "echo", "x"), (COMPLETIONS, "logprobs", "x"), (COMPLETIONS, "max_tokens", "x"),
    ("/tokenize", "prompt", 5), ("/tokenize", "messages", "x"),
    ("/detokenize", "tokens", "abc"), ("/detokenize", "tokens", [1.5]), ("/detokenize", "tokens", [-1]),
]


def hostile_cases(model: str, max_messages: int = 512, max_body_bytes: int = 1_000_000) -> list[Hostile]:
    """The hostile list for a service that serves `model` with these limits (the defaults are the
    service's defaults; everything else is far beyond any sane limit)."""
    chat = lambda **kw: _j(_chat(model, **kw))  # noqa: E731
    raw_chat = lambda tail: b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":"Hi"}],"max_tokens":4,' + tail + b"}"  # noqa: E731
    oversized = _j(_chat(model, "x" * (max_body_bytes + 1000)))
    cases = [
        # -- not JSON, or not a JSON object --
        Hostile("malformed-json", CHAT, b'{"model": "' + model.encode() + b'", "messages": [', param=None),
        Hostile("trailing-garbage", CHAT, chat() + b"}}", param=None),
        Hostile("body-list", CHAT, b"[1, 2, 3]", param=None),
        Hostile("body-string", CHAT, b'"Hello"', param=None),
        Hostile("body-null", CHAT, b"null", param=None),
        Hostile("body-number", CHAT, b"42", param=None),
        Hostile("body-empty", CHAT, b"", param=None),
        Hostile("body-whitespace", CHAT, b" \n\t ", param=None),
        Hostile("invalid-utf8-body", CHAT, b"\xff\xfe\xfa" + chat(), param=None),
        Hostile("invalid-utf8-in-string", CHAT, chat(content="@@").replace(b"@@", b"\xc3\x28\xa0\xa1"), param=None),
        Hostile("nul-bytes-in-string", CHAT, chat(content="a\x00b\x00"), statuses=(200, 400)),
        Hostile("duplicate-keys", CHAT, raw_chat(b'"n":1,"n":"two"'), param="n"),
        # -- values out of range --
        Hostile("n-1e9", CHAT, chat(n=10**9), param="n"),
        Hostile("n-zero", CHAT, chat(n=0), param="n"),
        Hostile("n-negative", CHAT, chat(n=-1), param="n"),
        Hostile("max-tokens-negative", CHAT, chat(max_tokens=-1), param="max_tokens"),
        Hostile("max-tokens-zero", CHAT, chat(max_tokens=0), param="max_tokens"),
        Hostile("max-tokens-1e12", CHAT, chat(max_tokens=10**12), param="max_tokens"),
        Hostile("max-tokens-1e40", CHAT, chat(max_tokens=10**40), param="max_tokens"),
        Hostile("max-completion-tokens-1e12", CHAT, chat(max_completion_tokens=10**12), param="max_completion_tokens"),
        Hostile("completion-max-tokens-1e12", COMPLETIONS, _j({"model": model, "prompt": "Hi", "max_tokens": 10**12}), param="max_tokens"),
        Hostile("top-logprobs-1e6", CHAT, chat(logprobs=True, top_logprobs=10**6), param="top_logprobs"),
        Hostile("top-logprobs-negative", CHAT, chat(logprobs=True, top_logprobs=-1), param="top_logprobs"),
        Hostile("completion-logprobs-1e6", COMPLETIONS, _j({"model": model, "prompt": "Hi", "max_tokens": 4, "logprobs": 10**6}), param="logprobs"),
        Hostile("seed-2e70", CHAT, chat(seed=2**70), param="seed"),
        Hostile("temperature-huge-int", CHAT, chat(temperature=10**400), param="temperature"),
        Hostile("integer-5000-digits", CHAT, raw_chat(b'"n":' + b"9" * 5000), param=ANY_PARAM),
        Hostile("n-1e308-float", CHAT, raw_chat(b'"n":1e308'), param="n"),
        # -- NaN and the infinities (Python's json accepts them; send them raw) --
        Hostile("temperature-nan", CHAT, raw_chat(b'"temperature":NaN'), param="temperature"),
        Hostile("temperature-infinity", CHAT, raw_chat(b'"temperature":Infinity'), param="temperature"),
        Hostile("top-p-nan", CHAT, raw_chat(b'"top_p":NaN'), param="top_p"),
        Hostile("presence-penalty-minus-infinity", CHAT, raw_chat(b'"presence_penalty":-Infinity'), param="presence_penalty"),
        Hostile("frequency-penalty-nan", CHAT, raw_chat(b'"frequency_penalty":NaN'), param="frequency_penalty"),
        Hostile("max-tokens-nan", COMPLETIONS, b'{"model":"' + model.encode() + b'","prompt":"Hi","max_tokens":NaN}', param="max_tokens"),
        Hostile("seed-infinity", CHAT, raw_chat(b'"seed":Infinity'), param="seed"),
        # -- stop sequences --
        Hostile("stop-5000-strings", CHAT, chat(stop=[f"s{i}" for i in range(5000)]), param="stop"),
        Hostile("stop-100k-chars", CHAT, chat(stop="x" * 100_000), param="stop"),
        Hostile("stop-empty-string", CHAT, chat(stop=""), param="stop"),
        Hostile("stop-list-with-empty", CHAT, chat(stop=["a", ""]), param="stop"),
        # -- prompts and messages --
        Hostile("messages-empty-list", CHAT, _j({"model": model, "messages": [], "max_tokens": 4}), param="messages"),
        Hostile("messages-missing", CHAT, _j({"model": model, "max_tokens": 4}), param="messages"),
        Hostile("message-not-object", CHAT, _j({"model": model, "messages": ["Hi"], "max_tokens": 4}), param="messages"),
        Hostile("message-role-missing", CHAT, _j({"model": model, "messages": [{"content": "Hi"}], "max_tokens": 4}), param="messages"),
        Hostile("role-unknown", CHAT, _j({"model": model, "messages": [{"role": "robot", "content": "Hi"}], "max_tokens": 4}), param="messages"),
        Hostile("role-tool", CHAT, _j({"model": model, "messages": [{"role": "tool", "content": "Hi", "tool_call_id": "1"}], "max_tokens": 4}), param="messages"),
        Hostile("role-wrong-case", CHAT, _j({"model": model, "messages": [{"role": "USER", "content": "Hi"}], "max_tokens": 4}), param="messages"),
        Hostile("message-unknown-key", CHAT, _j({"model": model, "messages": [{"role": "user", "content": "Hi", "x": 1}], "max_tokens": 4}), param="messages"),
        Hostile("content-image-part", CHAT, chat(content=[{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]), param="messages"),
        Hostile("content-part-without-text", CHAT, chat(content=[{"type": "text"}]), param="messages"),
        Hostile(f"messages-over-{max_messages}", CHAT,
                _j({"model": model, "messages": [{"role": "user", "content": "Hi"}] * (max_messages + 1), "max_tokens": 4}), param="messages"),
        # empty and whitespace-only text: a chat template still renders role markers, so a 200 is fine there
        Hostile("content-empty", CHAT, chat(content=""), statuses=(200, 400), param="messages"),
        Hostile("content-whitespace", CHAT, chat(content="   \n\t "), statuses=(200, 400), param="messages"),
        Hostile("content-null", CHAT, chat(content=None), statuses=(200, 400), param="messages"),
        Hostile("content-empty-parts", CHAT, chat(content=[]), statuses=(200, 400), param="messages"),
        Hostile("prompt-empty", COMPLETIONS, _j({"model": model, "prompt": "", "max_tokens": 4}), statuses=(200, 400), param="prompt"),
        Hostile("prompt-whitespace", COMPLETIONS, _j({"model": model, "prompt": "   ", "max_tokens": 4}), statuses=(200, 400), param="prompt"),
        Hostile("prompt-empty-list", COMPLETIONS, _j({"model": model, "prompt": [], "max_tokens": 4}), param="prompt"),
        Hostile("prompt-batch", COMPLETIONS, _j({"model": model, "prompt": ["a", "b"], "max_tokens": 4}), param="prompt"),
        Hostile("prompt-negative-token", COMPLETIONS, _j({"model": model, "prompt": [1, -5], "max_tokens": 4}), param="prompt"),
        # token ids past the vocabulary (and past 32 and 64 bits): the engine refuses them, or a fake one answers
        Hostile("prompt-token-out-of-vocab", COMPLETIONS, _j({"model": model, "prompt": [10**9], "max_tokens": 4}), statuses=(200, 400)),
        Hostile("prompt-token-2e70", COMPLETIONS, _j({"model": model, "prompt": [2**70], "max_tokens": 4}), statuses=(200, 400)),
        Hostile("prompt-token-2e70-echo", COMPLETIONS, _j({"model": model, "prompt": [2**70], "max_tokens": 4, "echo": True}), statuses=(200, 400)),
        Hostile("tokenize-both", "/tokenize", _j({"model": model, "prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]}), param="prompt"),
        Hostile("tokenize-neither", "/tokenize", _j({"model": model}), param="prompt"),
        Hostile("tokenize-bad-message", "/tokenize", _j({"model": model, "messages": [{"role": "robot"}]}), param="messages"),
        Hostile("detokenize-out-of-vocab", "/detokenize", _j({"model": model, "tokens": [10**9]}), statuses=(200, 400), param="tokens"),
        Hostile("detokenize-2e32", "/detokenize", _j({"model": model, "tokens": [2**32]}), statuses=(200, 400), param="tokens"),
        Hostile("detokenize-2e70", "/detokenize", _j({"model": model, "tokens": [2**70]}), statuses=(200, 400), param="tokens"),
        # -- deep nesting: a 400, not a RecursionError --
        Hostile("nested-lists-in-content-10000", CHAT,
                b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":' + _nested(10_000, "[", "]", "").encode() + b"}]}", param=ANY_PARAM),
        Hostile("nested-dicts-in-content-10000", CHAT,
                b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":' + _nested(10_000, '{"a":', "}", "1").encode() + b"}]}", param=ANY_PARAM),
        Hostile("nested-lists-body-100000", CHAT, _nested(100_000, "[", "]", "").encode(), param=ANY_PARAM),
        Hostile("nested-in-ignored-field", CHAT, raw_chat(b'"user":' + _nested(5_000, "[", "]", "1").encode()), param=ANY_PARAM),
        Hostile("nested-json-schema-500", CHAT,
                chat(response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": json.loads(_nested(500, '{"items":', "}", "{}"))}}),
                param="response_format"),
        Hostile("nested-json-schema-65", CHAT,
                chat(response_format={"type": "json_schema", "json_schema": {"name": "deep", "schema": json.loads(_nested(65, '{"items":', "}", "{}"))}}),
                param="response_format"),
        Hostile("nested-tokenize-messages", "/tokenize",
                b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":' + _nested(10_000, "[", "]", "").encode() + b"}]}", param=ANY_PARAM),
        # -- names and strings --
        Hostile("model-10k-chars", CHAT, _j(_chat("m" * 10_000)), statuses=(404,), param="model"),
        Hostile("model-empty", CHAT, _j(_chat("")), statuses=(400, 404), param="model"),
        Hostile("model-path-traversal", CHAT, _j(_chat("../../etc/passwd")), statuses=(404,), param="model"),
        Hostile("unknown-parameter", CHAT, chat(frobnicate=True), param="frobnicate"),
        Hostile("unsupported-tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), param="tools"),
        Hostile("stream-options-without-stream", CHAT, chat(stream_options={"include_usage": True}), param="stream_options"),
        Hostile("top-logprobs-without-logprobs", CHAT, chat(top_logprobs=2), param="top_logprobs"),
        Hostile("max-tokens-disagree", CHAT, chat(max_tokens=4, max_completion_tokens=5), param="max_completion_tokens"),
        # lone surrogates are legal JSON escapes but not text: refused or answered, never a 500
        Hostile("surrogate-in-content", CHAT, raw_chat(b'"n":1').replace(b'"Hi"', b'"Hi \\ud800 there"'), statuses=(200, 400)),
        Hostile("surrogate-in-stop", CHAT, raw_chat(b'"stop":"\\udfff"'), statuses=(200, 400)),
        Hostile("surrogate-in-json-schema", CHAT, raw_chat(b'"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","enum":["\\ud800"]}}}'),
                statuses=(200, 400)),
        Hostile("surrogate-in-model", CHAT, _j(_chat("m\ud800")), statuses=(400, 404), param="model"),
        Hostile("surrogate-in-tokenize-model", "/tokenize", _j({"model": "m\udc00", "prompt": "Hi"}), statuses=(400, 404), param="model"),
        Hostile("surrogate-in-detokenize-model", "/detokenize", _j({"model": "m\udc00", "tokens": [1]}), statuses=(400, 404), param="model"),
        Hostile("surrogate-in-unknown-key", CHAT, raw_chat(b'"\\ud800":1'), param=ANY_PARAM),
        Hostile("surrogate-echoed", COMPLETIONS, _j({"model": model, "prompt": "a\ud800b", "echo": True, "max_tokens": 2}), statuses=(200, 400), param="prompt"),
        Hostile("surrogate-echoed-stream", COMPLETIONS, _j({"model": model, "prompt": "a\ud800b", "echo": True, "max_tokens": 2, "stream": True}), statuses=(200, 400), param="prompt"),
        Hostile("surrogate-pair-split", CHAT, raw_chat(b'"stop":["\\udbff","\\udc00"]'), statuses=(200, 400)),
        # -- response_format --
        Hostile("json-schema-invalid-type", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}), param="response_format"),
        Hostile("json-schema-properties-not-object", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 5}}}), param="response_format"),
        Hostile("json-schema-bad-regex", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "("}}}), param="response_format"),
        Hostile("json-schema-not-object", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1, 2]}}), param="response_format"),
        Hostile("json-schema-missing", CHAT, chat(response_format={"type": "json_schema"}), param="response_format"),
        Hostile("json-schema-name-too-long", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "n" * 65}}), param="response_format"),
        Hostile("json-schema-nan", CHAT, raw_chat(b'"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"number","minimum":NaN}}}'),
                statuses=(200, 400), param="response_format"),
        Hostile("json-schema-remote-ref", CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "http://127.0.0.1:9/x.json"}}}),
                statuses=(200, 400), param="response_format"),
        Hostile("response-format-unknown-type", CHAT, chat(response_format={"type": "xml"}), param="response_format"),
        # -- size --
        Hostile("body-over-limit", CHAT, oversized, statuses=(413,), param=None),
        Hostile("body-over-limit-chunked", CHAT, oversized, statuses=(413,), param=None, chunked=True),
        Hostile("content-length-lies-large", CHAT, chat(), statuses=(413,), param=None,
                headers={"content-length": str(max_body_bytes * 10)}, over_http=False),
        # -- headers --
        Hostile("header-64k", CHAT, chat(), statuses=(431,), headers={"x-padding": "a" * 65_536}, server_level=True),
        Hostile("request-id-64k", CHAT, chat(), statuses=(431,), headers={"x-request-id": "r" * 65_536}, server_level=True),
        Hostile("content-type-text", CHAT, chat(), statuses=(200, 400, 415), headers={"content-type": "text/plain"}),
        Hostile("content-type-form", CHAT, chat(), statuses=(200, 400, 415), headers={"content-type": "application/x-www-form-urlencoded"}),
        Hostile("authorization-garbage", CHAT, chat(), statuses=(200, 401), headers={"authorization": "Bearer " + "x" * 4000}),
    ]
    for path, name, value in WRONG_TYPES:
        body = _chat(model) if path == CHAT else {"model": model, "prompt": "Hi", "max_tokens": 4} if path == COMPLETIONS else \
            {"model": model, "prompt": "Hi"} if path == "/tokenize" else {"model": model, "tokens": [1, 2]}
        if path == "/tokenize" and name == "messages":
            body.pop("prompt")
        body[name] = value
        label = "".join(ch if ch.isalnum() or ch == "." else "_" for ch in json.dumps(value))[:12]
        cases.append(Hostile(f"wrong-type-{path.strip('/').replace('/', '-')}-{name}={label}", path, _j(body), param=name,
                             statuses=(400, 404) if name == "model" else (400,)))
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


def check_outcome(case: Hostile, status: int, content_type: str, raw: bytes) -> None:
    """What every hostile case must come to: an allowed status, never a 5xx or a 422, and a 4xx in
    the OpenAI shape naming the expected parameter."""
    assert status < 500, f"{case.name}: {status} {raw[:300]!r}"
    assert status != 422, f"{case.name}: 422 is FastAPI's shape, not OpenAI's: {raw[:300]!r}"
    assert status in case.statuses, f"{case.name}: {status} not in {case.statuses}: {raw[:300]!r}"
    if status < 400:
        return
    if case.server_level and not content_type.startswith("application/json"):
        return  # refused by the HTTP server before the app saw it
    assert content_type.startswith("application/json"), f"{case.name}: {status} with {content_type!r}"
    body = json.loads(raw)
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, f"{case.name}: {body}"
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert error["type"] == ("authentication_error" if status == 401 else "invalid_request_error"), error
    if case.param is not ANY_PARAM and status != 401:
        assert error["param"] == case.param, f"{case.name}: param {error['param']!r}, expected {case.param!r}: {error['message'][:200]}"


def stream_is_clean(case: Hostile, content_type: str, text: str) -> None:
    if content_type.startswith("text/event-stream"):
        assert text.endswith("data: [DONE]\n\n"), f"{case.name}: stream did not end: {text[-200:]!r}"
        assert '"internal_error"' not in text, f"{case.name}: {text[-300:]!r}"


def request_args(case: Hostile) -> dict[str, Any]:
    headers = {"content-type": "application/json", **case.headers}
    return {"headers": headers}


def body_chunks(body: bytes, size: int = 64 * 1024):
    for i in range(0, len(body), size):
        yield body[i:i + size]


async def abody_chunks(body: bytes, size: int = 64 * 1024):
    for chunk in body_chunks(body, size):
        yield chunk


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
    normal = await asyncio.wait_for(client.post(CHAT, json=_chat(MODEL_ID)), CASE_TIMEOUT_S)
    assert normal.status_code == 200, normal.text
    assert normal.json()["choices"][0]["message"]["content"]


async def test_fake_engine_answers_where_a_real_one_might_refuse(client: httpx.AsyncClient):
    """The lone-surrogate cases the fake engine accepts come back as valid UTF-8 JSON, the surrogate
    escaped as JSON allows (it used to be a UnicodeEncodeError, a 500)."""
    echoed = await client.post(COMPLETIONS, content=_j({"model": MODEL_ID, "prompt": "a\ud800b", "echo": True, "max_tokens": 2}),
                               headers={"content-type": "application/json"})
    assert echoed.status_code == 200, echoed.text
    assert b"\\ud800" in echoed.content
    assert json.loads(echoed.content)["choices"][0]["text"].startswith("a\ud800b")
    streamed = await client.post(COMPLETIONS, content=_j({"model": MODEL_ID, "prompt": "a\ud800b", "echo": True, "max_tokens": 2, "stream": True}),
                                 headers={"content-type": "application/json"})
    assert streamed.status_code == 200 and "internal_error" not in streamed.text, streamed.text
    unknown = await client.post("/tokenize", content=_j({"model": "m\udc00", "prompt": "Hi"}), headers={"content-type": "application/json"})
    assert unknown.status_code == 404 and json.loads(unknown.content)["error"]["message"].startswith("The model 'm\udc00'")


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
    from unit_support import make_config

    config = make_config()
    stack = make_stack(config, NarrowTokenizerEngine(max_model_len=config.models[0].engine.max_model_len))
    case = Hostile("detokenize-2e32", "/detokenize", _j({"model": MODEL_ID, "tokens": [2**32]}), param="tokens")
    response = await stack.client.post(case.path, content=case.body, headers={"content-type": "application/json"})
    check_outcome(case, response.status_code, response.headers["content-type"], response.content)
    case = Hostile("prompt-token-2e70-echo", COMPLETIONS, _j({"model": MODEL_ID, "prompt": [2**70], "max_tokens": 4, "echo": True}), param="prompt")
    response = await stack.client.post(case.path, content=case.body, headers={"content-type": "application/json"})
    check_outcome(case, response.status_code, response.headers["content-type"], response.content)
    stats = (await stack.client.get("/stats")).json()[MODEL_ID]
    assert stats["admission"]["in_system"] == 0, stats  # the refused echo gave its admission ticket back
    assert (await stack.client.post("/detokenize", json={"model": MODEL_ID, "tokens": [72, 105]})).json() == {"prompt": "Hi"}


@pytest.mark.parametrize("cause,errored,expected", [
    (UnicodeEncodeError("utf-8", "\udfff", 0, 1, "surrogates not allowed"), False, "EngineRejected"),
    (KeyError("internal"), False, "RuntimeError"),
    (UnicodeEncodeError("utf-8", "\udfff", 0, 1, "surrogates not allowed"), True, "EngineDead"),
], ids=["client-cause", "server-cause", "engine-errored"])
async def test_vllm_per_request_failure_is_not_engine_death(model_config, cause, errored, expected):
    """vLLM wraps any unexpected per-request failure in EngineGenerateError ("possibly recoverable"); a
    lone surrogate in a stop string is one (msgpack cannot encode it). It was mapped to EngineDead, so one
    such request got the replica's engine declared dead and replaced; and vLLM had already registered the
    request without ever aborting it, so it counted as running forever."""
    vllm_engine = pytest.importorskip("app.vllm_engine")  # imports vLLM: a few seconds
    from vllm.v1.engine.exceptions import EngineGenerateError

    from app.engine import EngineDead, EngineRejected, GenerationParams

    class FailingLLM:
        def __init__(self):
            self.errored = errored
            self.aborted = []

        async def abort(self, request_id):
            self.aborted.append(request_id)

        async def generate(self, prompt, sampling, request_id):
            raise EngineGenerateError() from cause
            yield  # an async generator, like AsyncLLM.generate

    engine = vllm_engine.VLLMEngine(model_config)
    engine._llm = llm = FailingLLM()
    with pytest.raises((EngineRejected, EngineDead, RuntimeError)) as raised:
        async for _ in engine.generate("r1", [1, 2, 3], GenerationParams(max_tokens=2, stop=("\udfff",))):
            pass
    assert type(raised.value).__name__ == expected, raised.value
    assert llm.aborted == ([] if errored else ["r1"])  # a live engine forgets the request
    engine._llm = None  # nothing to shut down

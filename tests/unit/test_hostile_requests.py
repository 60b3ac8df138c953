"""Requests that would cost the service more than they are worth: giant prompts, tokenizer floods, aborts that
must complete whatever cancels them, keys that must be there, paths behind a route prefix, requests that
outlive their time limit."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from app.api_keys import ApiKeys, digest_of
from app.config.app_config import parse_config
from app.config.common import ConfigError
from app.engine.fake import FakeEngine
from app.engine.interface import PromptInput
from app.errors import ContextLengthExceeded, QueueFull
from app.host.engine_host import EngineHost
from app.http.gate import route_path
from app.http.ingress import create_app
from app.tenancy import key_tenant_name
from tests.support.fake_stack import MODEL_ID, chat_body, config_dict, make_config, make_request
from tests.support.waiting import until

GIANT = "x" * 300_000  # far over any limit: the fake engine counts one token per byte, and the limit is 255


class CountingEngine(FakeEngine):
    """Counts the prompts it was asked to tokenize."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.encoded = 0

    def encode(self, text: str) -> list[int]:
        self.encoded += 1
        return super().encode(text)

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        self.encoded += 1
        return super().render_chat(messages)


class SlowAbortEngine(FakeEngine):
    """An engine whose abort has to await (as a remote engine's would)."""

    async def abort(self, request_id: str) -> None:
        await asyncio.sleep(0.05)  # the awaiting is the behaviour under test
        await super().abort(request_id)


# -- cost before commitment ------------------------------------------------------------------------


async def test_a_prompt_certainly_too_long_is_refused_without_tokenizing_or_a_slot(make_stack):
    engine = CountingEngine()
    stack = make_stack(engine=engine)
    for body in (chat_body(GIANT), {"model": MODEL_ID, "prompt": GIANT}):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        r = await stack.client.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert "at least 300000 tokens" in r.json()["error"]["message"]
    r = await stack.client.post("/tokenize", json={"model": MODEL_ID, "prompt": GIANT})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert engine.encoded == 0
    assert stack.host.admission.stats().in_system == 0
    assert (await stack.client.post("/v1/chat/completions", json=chat_body())).status_code == 200


async def test_tokenizing_holds_no_admission_slot_and_its_queue_is_bounded():
    cfg = make_config(deployment={"max_ongoing_requests": 2, "max_queued_requests": 0})
    engine = FakeEngine()
    host = EngineHost(cfg.models[0], engine)
    gate = asyncio.Event()
    in_thread = host.prompts.in_thread

    async def held_tokenizer(fn, *args):  # the tokenizer thread is busy until `gate` opens
        await gate.wait()
        return await in_thread(fn, *args)

    host.prompts.in_thread = held_tokenizer
    waiting = [asyncio.ensure_future(anext(host.generate(make_request("hi")))) for _ in range(2)]
    await until(lambda: host.prompts.waiting == 2, what="two prompts waiting for the tokenizer")
    assert host.admission.stats().in_system == 0  # no slot is held while waiting for the tokenizer
    with pytest.raises(QueueFull, match="tokenizer"):
        await anext(host.generate(make_request("hi")))
    gate.set()
    assert all(type(r).__name__ == "Admitted" for r in await asyncio.gather(*waiting))


async def test_a_full_replica_refuses_tokenize_before_tokenizing():
    cfg = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0})
    engine = CountingEngine(token_delay_s=0.01)
    host = EngineHost(cfg.models[0], engine)
    stream = host.generate(make_request("hi", max_tokens=50, ignore_eos=True))
    await anext(stream)  # holds the only slot
    encoded = engine.encoded
    with pytest.raises(QueueFull):
        await host.tokenize(make_request("more").prompt)
    with pytest.raises(QueueFull):
        await host.detokenize([1, 2, 3])
    assert engine.encoded == encoded
    await stream.aclose()


async def test_detokenize_is_bounded_by_the_context():
    host = EngineHost(make_config().models[0], FakeEngine())
    with pytest.raises(Exception, match="at most max_model_len"):
        await host.detokenize(list(range(257)))
    assert await host.detokenize([104, 105]) == "hi"


async def test_token_id_prompts_over_the_limit_are_refused_at_once():
    host = EngineHost(make_config().models[0], FakeEngine())
    with pytest.raises(ContextLengthExceeded):
        await anext(host.generate(make_request(PromptInput(token_ids=tuple(range(300))))))


# -- aborts ----------------------------------------------------------------------------------------------


async def test_an_abort_that_awaits_completes_even_when_the_stream_is_cancelled_again_and_again():
    engine = SlowAbortEngine(token_delay_s=0.01)
    host = EngineHost(make_config().models[0], engine)
    request = make_request("hi", max_tokens=100, ignore_eos=True)

    async def consume() -> None:
        async for _ in host.generate(request):
            pass

    task = asyncio.ensure_future(consume())
    await engine.wait_running(1)
    for _ in range(5):  # anyio's cancel scopes cancel again at every await until the task is gone
        task.cancel()
        await asyncio.sleep(0.005)  # lets the cancellation land inside the awaiting abort
    with pytest.raises(asyncio.CancelledError):
        await task
    assert request.request_id in engine.aborted
    assert host.admission.stats().in_system == 0


# -- keys --------------------------------------------------------------------------------------------------


def test_keys_as_digests_are_accepted_and_plain_keys_are_matched_by_digest():
    keys = ApiKeys.of(["plain-key", digest_of("secret-key")])
    assert keys.accept(b"Bearer plain-key") and keys.accept(b"bearer secret-key")
    assert not keys.accept(b"Bearer " + digest_of("secret-key").encode())  # the digest itself is no key
    assert not keys.accept(b"Bearer wrong") and not keys.accept(b"secret-key") and not keys.accept(b"Bearer ")


def test_a_malformed_digest_is_a_config_error():
    data = config_dict()
    data["service"] = {"api_keys": ["sha256:abc"]}
    with pytest.raises(ConfigError, match="api_keys"):
        parse_config(data)


def test_keys_are_resolved_where_the_app_is_built_and_reach_replicas_as_digests(monkeypatch):
    monkeypatch.setenv("APP_API_KEYS", "from-the-shell")
    data = config_dict()
    data["service"] = {"api_keys": ["from-the-file"]}
    resolved = parse_config(data).with_resolved_keys()
    assert set(resolved.service.api_keys) == {digest_of("from-the-shell"), digest_of("from-the-file")}
    assert not {"from-the-shell", "from-the-file"} & set(resolved.service.api_keys)  # no plain key travels
    monkeypatch.delenv("APP_API_KEYS")  # a replica elsewhere: its environment has no keys
    assert ApiKeys.of(resolved.service.api_keys).accept(b"Bearer from-the-shell")


def test_reachable_beyond_loopback_without_keys_refuses_to_start_unless_told_to_warn(monkeypatch):
    from app.rayserve.replicas import _refuse_open_access

    monkeypatch.delenv("APP_API_KEYS", raising=False)
    open_config = parse_config({**config_dict(), "service": {"host": "0.0.0.0"}})
    with pytest.raises(ConfigError, match="no API key"):
        _refuse_open_access(open_config, listen=True)
    _refuse_open_access(parse_config({**config_dict(), "service": {"host": "0.0.0.0", "without_api_keys": "warn"}}),
                        listen=True)
    _refuse_open_access(parse_config({**config_dict(), "service": {"host": "0.0.0.0", "api_keys": ["k"]}}),
                        listen=True)
    _refuse_open_access(make_config(), listen=True)  # 127.0.0.1: nothing to refuse


# -- the route path behind a prefix ------------------------------------------------------------------------


def test_route_path_drops_the_root_path():
    assert route_path({"path": "/llm/health", "root_path": "/llm"}) == "/health"
    assert route_path({"path": "/llm", "root_path": "/llm"}) == "/"
    assert route_path({"path": "/health", "root_path": ""}) == "/health"


async def test_behind_a_route_prefix_probes_stay_open_and_keys_and_capacity_still_apply():
    cfg = make_config(service={"api_keys": ["k"]}, deployment={"max_ongoing_requests": 1, "max_queued_requests": 0})
    host = EngineHost(cfg.models[0], FakeEngine())
    app = create_app(cfg, {MODEL_ID: host})
    transport = httpx.ASGITransport(app=app, root_path="/llm")
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/llm/health")).status_code == 200  # open, as /health is
        assert (await client.get("/llm/v1/models")).status_code == 401
        auth = {"Authorization": "Bearer k"}
        capacity = app.state.ingress.capacity
        # As if this key's tenant held the one slot: a tenant holding nothing would still be let through (fair
        # shares, app/http/capacity.py's Capacity).
        capacity.inflight[MODEL_ID] = capacity.limit[MODEL_ID]
        capacity.held[MODEL_ID][key_tenant_name(digest_of("k").removeprefix("sha256:"))] = capacity.limit[MODEL_ID]
        r = await client.post("/llm/v1/chat/completions", content=b"not even json", headers=auth)
        assert r.status_code == 429  # refused for capacity before the body is read
        r = await client.post("/llm/tokenize", content=b"not even json", headers=auth)
        assert r.status_code == 429


# -- a request past its time limit, wherever it is --------------------------------------------------------


async def test_a_request_past_its_time_limit_while_not_yet_answered_is_a_504(make_stack):
    class Stuck(FakeEngine):
        async def check_health(self) -> None:
            await asyncio.sleep(3600)  # a backend that never answers is the behaviour under test

    stack = make_stack(config=make_config(service={"request_timeout_s": 0.5}), engine=Stuck())
    # /health waits on the engine's check (up to 5 s), past the gate's deadline (0.5 s + 2 s margin).
    r = await stack.client.get("/health")
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_typed_as_json_is_told_which_header_to_send(client, content_type):
    headers = {"content-type": content_type} if content_type else {}
    r = await client.post("/v1/chat/completions", content=json.dumps(chat_body()).encode(), headers=headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_media_type" and error["param"] is None
    assert "Content-Type: application/json" in error["message"]
    assert (repr(content_type) if content_type else "untyped") in error["message"]


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8",
                                          "application/vnd.api+json"])
async def test_json_media_types_are_served(client, content_type):
    r = await client.post("/v1/chat/completions", content=json.dumps(chat_body(max_tokens=2)).encode(),
                          headers={"content-type": content_type})
    assert r.status_code == 200, r.text

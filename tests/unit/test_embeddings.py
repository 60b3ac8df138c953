"""POST /v1/embeddings in-process: an embedding model (`runner: embed`) over the fake engine, through the HTTP app,
the OpenAI SDK (async and sync), the host's admission and aborts, and the handle backend's error path."""

from __future__ import annotations

import asyncio
import base64
import math
import struct
import uuid

import httpx
import openai
import pytest

from app.config.app_config import parse_config
from app.config.common import ConfigError
from app.config.service import ServiceConfig
from app.engine.fake import FakeEngine
from app.engine.fake_model import EMBEDDING_SIZE
from app.engine.interface import Embeddings, EmbedRequest, PromptInput
from app.errors import InvalidRequest, QueueFull, RequestQuarantined, ServiceUnavailable
from app.host.replica_load import ReplicaLoad
from app.openai.embeddings import base64_of
from app.rayserve.handle_backend import HandleBackend, Refused
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MAX_MODEL_LEN, MODEL_ID, chat_body, config_dict, listening, make_config
from tests.support.waiting import until

EMBED = "/v1/embeddings"


def embed_config(**overrides):
    return make_config(runner="embed", **overrides)


@pytest.fixture
def embed_stack(make_stack):
    return make_stack(embed_config(), FakeEngine(max_model_len=MAX_MODEL_LEN, matryoshka=True))


@pytest.fixture
def ec(embed_stack) -> httpx.AsyncClient:
    return embed_stack.client


def error_of(resp: httpx.Response, status: int, param: str | None) -> dict:
    assert resp.status_code == status, resp.text
    error = assert_error_shape(status, resp.headers.get("content-type", ""), resp.content)
    assert error["param"] == param, error
    return error


async def embed(client: httpx.AsyncClient, **body) -> httpx.Response:
    return await client.post(EMBED, json={"model": MODEL_ID, **body})


def norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


# -- the answer's shape ---------------------------------------------------------------------------


async def test_float_answer_has_vllms_shape(ec):
    resp = await embed(ec, input="Hello")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["id"].startswith("embd-") and body["object"] == "list" and body["model"] == MODEL_ID
    assert body["created"] > 0
    [item] = body["data"]
    assert item["index"] == 0 and item["object"] == "embedding"
    assert len(item["embedding"]) == EMBEDDING_SIZE and abs(norm(item["embedding"]) - 1) < 1e-6
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5, "completion_tokens": 0,
                             "prompt_tokens_details": None, "completion_tokens_details": None}


async def test_metrics_and_the_access_log_name_the_route(ec):
    assert (await embed(ec, input="Hello")).status_code == 200
    metrics = (await ec.get("/metrics")).text
    assert 'endpoint="/v1/embeddings"' in metrics and 'status="200"' in metrics


async def test_a_list_is_answered_in_order_with_indexes_and_summed_usage(ec):
    texts = ["alpha", "beta", "alpha", "gamma!"]
    body = (await embed(ec, input=texts)).json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    vectors = [d["embedding"] for d in body["data"]]
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1] != vectors[3]  # same input, same vector
    singles = [(await embed(ec, input=t)).json()["data"][0]["embedding"] for t in texts]
    assert singles == vectors  # batched or alone, the same
    assert body["usage"]["prompt_tokens"] == sum(len(t) for t in texts)  # the fake engine: a token per byte


async def test_base64_decodes_to_the_float_answer(ec):
    floats = (await embed(ec, input=["one", "two"])).json()["data"]
    b64 = (await embed(ec, input=["one", "two"], encoding_format="base64")).json()["data"]
    for f, b in zip(floats, b64, strict=True):
        raw = base64.b64decode(b["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == f["embedding"]  # float32, little-endian
    assert base64_of([1.0, -2.5]) == base64.b64encode(struct.pack("<2f", 1.0, -2.5)).decode()


async def test_token_ids_embed_as_the_text_they_spell(ec, embed_stack):
    text = "Hello there"
    ids = embed_stack.engine.encode(text)
    by_text = (await embed(ec, input=text)).json()
    by_ids = (await embed(ec, input=ids)).json()
    assert by_ids["data"][0]["embedding"] == by_text["data"][0]["embedding"]
    batch = (await embed(ec, input=[ids, ids[:5]])).json()
    assert [d["index"] for d in batch["data"]] == [0, 1]
    assert batch["data"][0]["embedding"] == by_text["data"][0]["embedding"]
    assert batch["usage"]["prompt_tokens"] == len(ids) + 5


async def test_dimensions_shorten_a_matryoshka_vector(ec):
    resp = await embed(ec, input="Hello", dimensions=8)
    vector = resp.json()["data"][0]["embedding"]
    assert len(vector) == 8 and abs(norm(vector) - 1) < 1e-6  # the first values, renormalized, as vLLM's pooler
    full = (await embed(ec, input="Hello")).json()["data"][0]["embedding"]
    scale = norm(full[:8])
    assert vector == pytest.approx([x / scale for x in full[:8]], rel=1e-5)
    err = error_of(await embed(ec, input="Hello", dimensions=EMBEDDING_SIZE + 1), 400, "dimensions")
    assert f"range [1, {EMBEDDING_SIZE}]" in err["message"]
    error_of(await embed(ec, input="Hello", dimensions=0), 400, "dimensions")


async def test_dimensions_are_refused_as_vllm_refuses_them(make_stack):
    plain = make_stack(embed_config(), FakeEngine(max_model_len=MAX_MODEL_LEN)).client
    err = error_of(await embed(plain, input="x", dimensions=8), 400, "dimensions")
    assert err["message"] == (f"Model '{MODEL_ID}' does not support Matryoshka embeddings; dimensions must be unset "
                              "(received dimensions=8).")
    sized = make_stack(embed_config(), FakeEngine(max_model_len=MAX_MODEL_LEN, matryoshka=(8, 16))).client
    assert len((await embed(sized, input="x", dimensions=16)).json()["data"][0]["embedding"]) == 16
    err = error_of(await embed(sized, input="x", dimensions=12), 400, "dimensions")
    assert "Matryoshka dimensions [8, 16], got 12" in err["message"]


async def test_truncate_prompt_tokens_keeps_the_last_tokens(ec):
    whole = (await embed(ec, input="abcdefgh")).json()
    cut = (await embed(ec, input="abcdefgh", truncate_prompt_tokens=3)).json()
    tail = (await embed(ec, input="fgh")).json()
    assert cut["data"][0]["embedding"] == tail["data"][0]["embedding"] != whole["data"][0]["embedding"]
    assert cut["usage"]["prompt_tokens"] == 3


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": ["a", ""]}, "input"),
    ({"input": 5}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": [[1], ["a"]]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": [300]}, "input"),  # past the fake engine's vocabulary of 256: the engine's refusal
    ({"input": ["a"] * 9}, "input"),  # limits.max_embedding_inputs below
    ({"input": "x" * (MAX_MODEL_LEN + 1)}, "input"),
    ({"input": list(range(100)) * 3}, "input"),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "a", "encoding_format": "bytes"}, "encoding_format"),
    ({"input": "a", "dimensions": "many"}, "dimensions"),
    ({"input": "a", "embed_dtype": "bfloat16"}, "embed_dtype"),
    ({"input": "a", "normalize": False}, "normalize"),
    ({"input": "a", "truncation_side": "middle"}, "truncation_side"),
])
async def test_bad_input_is_a_400_naming_the_parameter(make_stack, body, param):
    client = make_stack(embed_config(limits={"max_embedding_inputs": 8}),
                        FakeEngine(max_model_len=MAX_MODEL_LEN, matryoshka=True)).client
    error_of(await embed(client, **body), 400, param)
    assert (await embed(client, input="still fine")).status_code == 200


async def test_too_long_is_the_length_contracts_400(ec):
    err = error_of(await embed(ec, input=["ok", "y" * 300]), 400, "input")
    assert err["code"] == "context_length_exceeded"
    counted = error_of(await embed(ec, input=[list(range(10)), [1] * MAX_MODEL_LEN]), 400, "input")
    assert counted["code"] == "context_length_exceeded" and f"at most {MAX_MODEL_LEN - 1}" in counted["message"]


async def test_no_op_vllm_options_are_accepted(ec):
    resp = await embed(ec, input="a", user="u1", embed_dtype="float32", endianness="native", use_activation=True,
                       add_special_tokens=True, priority=0, padding="do_not_pad", cache_salt=None)
    assert resp.status_code == 200, resp.text
    for name, value, said in (("padding", "max_length", "'do_not_pad'"), ("cache_salt", "s", "null")):
        err = error_of(await embed(ec, input="a", **{name: value}), 400, name)
        assert err["code"] == "unsupported_parameter" and f"only as {said}" in err["message"]


async def test_an_embeddings_answer_is_named_as_vllm_names_it(ec):
    assert (await embed(ec, input="a", request_id="e-1")).json()["id"] == "embd-e-1"
    headed = await ec.post("/v1/embeddings", json={"model": MODEL_ID, "input": "a", "request_id": "e-1"},
                           headers={"X-Request-Id": "trace-2"})
    assert headed.json()["id"] == "embd-trace-2"
    error_of(await embed(ec, input="a", request_id="x" * 129), 400, "request_id")


async def test_each_route_refuses_a_model_of_the_other_runner(make_stack, ec):
    generating = make_stack().client
    err = error_of(await embed(generating, input="x"), 400, "model")
    assert MODEL_ID in err["message"] and "Embeddings API" in err["message"]
    for path, body in [("/v1/chat/completions", chat_body()),
                       ("/v1/completions", {"model": MODEL_ID, "prompt": "x"}),
                       ("/v1/responses", {"model": MODEL_ID, "input": "x"})]:
        err = error_of(await ec.post(path, json=body), 400, "model")
        assert MODEL_ID in err["message"] and "served for embeddings" in err["message"]
    assert (await ec.post("/tokenize", json={"model": MODEL_ID, "prompt": "abc"})).json()["count"] == 3


def test_runner_is_checked_in_the_config():
    assert parse_config(config_dict(runner="embed")).models[0].runner == "embed"
    with pytest.raises(ConfigError, match="runner"):
        parse_config(config_dict(runner="pooling"))
    with pytest.raises(ConfigError, match="max_embedding_inputs"):
        parse_config(config_dict(limits={"max_embedding_inputs": 0}))


# -- admission, cancellation, failure -------------------------------------------------------------


def _request(*texts: str, timeout_s: float = 30.0) -> EmbedRequest:
    return EmbedRequest(request_id=f"embd-{uuid.uuid4().hex}", timeout_s=timeout_s,
                        inputs=tuple(PromptInput(text=t, param="input") for t in texts))


async def test_a_full_replica_refuses_with_retry_after(make_stack):
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=60)
    stack = make_stack(embed_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0}), engine)
    first = asyncio.create_task(stack.host.embed(_request("a", "b")))
    await engine.wait_running(2)  # one request, its two inputs side by side in the engine
    resp = await embed(stack.client, input="c")
    assert resp.status_code == 429 and int(resp.headers["retry-after"]) >= 1
    assert resp.json()["error"]["code"] == "queue_full"
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await engine.wait_aborted(count=2)
    assert stack.host.admission.stats().in_system == 0


async def test_a_batch_is_admitted_whole_against_the_token_budget(make_stack):
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=60)
    stack = make_stack(embed_config(deployment={"token_budget": 10, "queue_timeout_s": 0.2, "ttft_target_s": None}),
                       engine)
    first = asyncio.create_task(stack.host.embed(_request("abcdef")))  # 6 of the 10 tokens
    await engine.wait_running(1)
    resp = await embed(stack.client, input=["ab", "cd", "e"])  # 5 more: waits whole, then times out whole
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "queue_timeout"
    assert len(engine.running) == 1  # none of the batch's inputs entered the engine
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await engine.wait_aborted(count=1)


async def test_a_cancelled_request_aborts_every_input_in_the_engine(make_stack):
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=60)
    stack = make_stack(embed_config(), engine)
    request = _request("a", "b", "c")
    task = asyncio.create_task(stack.host.embed(request))
    await engine.wait_running(3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await engine.wait_aborted(count=3)
    assert sorted(engine.aborted) == [f"{request.request_id}-{i}" for i in range(3)]
    assert not engine.running and stack.host.admission.stats().in_system == 0


async def test_a_request_past_its_time_is_a_504_and_aborted(make_stack):
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=60)
    stack = make_stack(embed_config(), engine)
    with pytest.raises(Exception) as err:
        await stack.host.embed(_request("a", "b", timeout_s=0.05))
    assert getattr(err.value, "status", None) == 504
    await engine.wait_aborted(count=2)


async def test_a_dead_engine_is_a_retryable_503(make_stack):
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN)
    stack = make_stack(embed_config(), engine)
    engine.kill()
    resp = await embed(stack.client, input="a")
    assert resp.status_code == 503 and resp.headers["retry-after"]


# -- the OpenAI SDK -------------------------------------------------------------------------------


async def test_async_sdk(embed_stack):
    sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", max_retries=0,
                             http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=embed_stack.app)))
    try:
        default = await sdk.embeddings.create(model=MODEL_ID, input=["Hello", "world"])  # the SDK asks for base64
        floats = await sdk.embeddings.create(model=MODEL_ID, input=["Hello", "world"], encoding_format="float")
        assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
        assert [d.index for d in floats.data] == [0, 1] and floats.usage.prompt_tokens == 10
        short = await sdk.embeddings.create(model=MODEL_ID, input=[72, 105], dimensions=4)
        assert len(short.data[0].embedding) == 4
        with pytest.raises(openai.BadRequestError) as err:
            await sdk.embeddings.create(model=MODEL_ID, input="")
        assert err.value.body["param"] == "input"
    finally:
        await sdk.close()


async def test_sync_sdk_over_a_socket(embed_stack):
    async with listening(embed_stack) as base_url:
        def call() -> list[list[float]]:
            with openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0) as sdk:
                return [d.embedding for d in sdk.embeddings.create(model=MODEL_ID, input=["a", "bc"]).data]

        vectors = await asyncio.to_thread(call)
    assert len(vectors) == 2 and all(len(v) == EMBEDDING_SIZE for v in vectors) and vectors[0] != vectors[1]


# -- across a Serve handle (the ingress tier) -----------------------------------------------------


class _Answers:
    """A stand-in handle whose `embed_remote` answers each call with the next of `answers`."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), []

    def options(self, **_):
        return self

    @property
    def embed_remote(self):
        return self

    def remote(self, *args):
        self.calls.append(args)
        answer = self.answers.pop(0)

        async def result():
            if isinstance(answer, BaseException):
                raise answer
            return answer

        return result()


async def test_handle_backend_retries_a_full_replica_and_passes_a_400_through():
    answer = Embeddings(vectors=((1.0, 0.0),), prompt_tokens=3)
    handle = _Answers(Refused(QueueFull("full", retry_after_s=1), replica="r1"), answer)
    backend = HandleBackend(handle)  # type: ignore[arg-type]
    assert await backend.embed(_request("a")) == answer
    assert handle.calls[1][1] == ("r1",)  # the second attempt avoids the replica that refused
    refused = _Answers(Refused(InvalidRequest("bad", param="input"), replica="r1"))
    with pytest.raises(InvalidRequest) as err:
        await HandleBackend(refused).embed(_request("a"))  # type: ignore[arg-type]
    assert err.value.param == "input" and len(refused.calls) == 1


async def test_handle_backend_does_not_ask_its_only_replica_again_when_full():
    handle = _Answers(Refused(QueueFull("full", retry_after_s=1), replica="r1"),
                      Embeddings(vectors=((1.0, 0.0),), prompt_tokens=3))
    backend = HandleBackend(handle)  # type: ignore[arg-type]
    backend._loads = lambda: {"r1": ReplicaLoad()}  # type: ignore[method-assign]  # the one replica known
    with pytest.raises(QueueFull):
        await backend.embed(_request("a"))
    assert len(handle.calls) == 1


async def test_an_embedding_whose_lone_replica_s_engine_broke_under_it_waits_for_it_to_serve_again(monkeypatch):
    """Behind the ingress tier with one replica (an autoscaled model at its minimum), the engine broke with the
    request in it and restarts in place: the ingress waits for the replica to serve again, then sends it again whole,
    as it continues a generation there, instead of answering the 503."""
    from app.rayserve import handle_backend

    monkeypatch.setattr(handle_backend, "REFUSED_PAUSE_S", 0.0)
    monkeypatch.setattr(handle_backend, "WAIT_POLL_S", 0.001)
    broke = ServiceUnavailable("the engine for 'm' stopped serving while this request was in it (died); retry",
                               retry_after_s=5)
    answer = Embeddings(vectors=((1.0, 0.0),), prompt_tokens=3)
    handle = _Answers(Refused(broke, replica="r1", in_flight=True), answer)
    backend = HandleBackend(handle)  # type: ignore[arg-type]
    polls = []

    def loads() -> dict[str, ReplicaLoad]:
        polls.append(len(handle.calls))
        return {"r1": ReplicaLoad(serving=len(polls) > 20)}  # restarting for the first 20 looks

    backend._loads = loads  # type: ignore[method-assign]
    assert await backend.embed(_request("a")) == answer
    assert len(polls) > 20 and set(polls[:20]) == {1}  # waited with one call made, and sent again only then
    assert handle.calls[1][1] == ()  # to the replica serving again, the one it broke on included


async def test_an_embedding_refused_on_arrival_by_a_restarting_lone_replica_is_not_held(monkeypatch):
    """Refused on arrival (the engine was already restarting): nothing was invested, so the 503 and its Retry-After
    come at once, as for a generation, and no wait for the replica is made."""
    restarting = ServiceUnavailable("the engine for 'm' is restarting (died); retry shortly", retry_after_s=5)
    handle = _Answers(*(Refused(restarting, replica="r1") for _ in range(3)))
    backend = HandleBackend(handle)  # type: ignore[arg-type]
    backend._loads = lambda: {"r1": ReplicaLoad(serving=False)}  # type: ignore[method-assign]
    waits = []

    async def wait(*args):
        waits.append(args)

    monkeypatch.setattr(backend, "_until_a_replica_serves", wait)
    with pytest.raises(ServiceUnavailable) as err:
        await backend.embed(_request("a"))
    assert err.value.retry_after_s == 5 and not waits


async def test_the_replica_says_whether_its_engine_broke_with_the_embedding_in_it():
    """`EngineReplica.embed_remote` marks a refusal `in_flight` only when the engine it sent the request to broke."""
    from app.rayserve.replicas import EngineReplica

    model = embed_config(engine={"max_model_len": MAX_MODEL_LEN, "fake_token_delay_s": 0.5}).models[0]
    replica = EngineReplica(model, ServiceConfig())
    try:
        task = asyncio.create_task(replica.embed_remote(_request("one", "two")))
        await until(lambda: replica.host.engine.stats().running == 2, what="both inputs in the engine")
        replica.host.engine.kill()
        refused = await asyncio.wait_for(task, 30)
        assert isinstance(refused, Refused) and isinstance(refused.error, ServiceUnavailable) and refused.in_flight
        await until(lambda: replica.host.supervisor.serving_engine() is None, what="the engine out of service")
        refused = await replica.embed_remote(_request("three"))
        assert isinstance(refused, Refused) and not refused.in_flight  # refused on arrival
    finally:
        replica.host.shutdown()


async def test_the_host_refuses_the_other_runners_requests_too(make_stack):
    """Behind the ingress tier the replica checks again: a request that reached the wrong engine is a 400."""
    from tests.support.fake_stack import make_request

    embedding = make_stack(embed_config(), FakeEngine(max_model_len=MAX_MODEL_LEN)).host
    with pytest.raises(InvalidRequest) as err:
        await anext(embedding.generate(make_request("Hello")))
    assert err.value.param == "model"
    generating = make_stack().host
    with pytest.raises(InvalidRequest) as err:
        await generating.embed(_request("Hello"))
    assert err.value.param == "model" and not generating.engine.running


async def test_a_large_embeddings_answer_is_encoded_with_the_loop_given_back_between_pieces():
    """Issue 27: 256 inputs x 4,096 dimensions (20 MB of JSON) were encoded in one go on the event loop, 0.64 s
    in which no stream on that loop moved. The body is the same bytes; other tasks run while it is made."""
    import asyncio

    from app.http.wire_json import dumps, dumps_yielding

    payload = {"object": "list", "data": [{"index": i, "embedding": [0.001 * i] * 4096} for i in range(64)],
               "model": "m", "usage": {"prompt_tokens": 3}}
    ticks = 0
    stop = asyncio.Event()

    async def other_stream():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_stream())
    await asyncio.sleep(0)
    started = ticks
    body = await dumps_yielding(payload, "data")
    stop.set()
    await other
    assert body == dumps(payload)
    assert ticks - started >= 4  # 64 vectors of ~25 KB of JSON each: given back every ~256 KB


async def test_an_embedding_whose_engine_broke_under_it_on_two_replicas_is_held_back():
    """As a generation: the second break with it inside ends it with `request_quarantined`, and its copy is refused
    without a call (app/engine/quarantine.py)."""
    broke = ServiceUnavailable("the engine failed while serving this request", retry_after_s=5)
    answer = Embeddings(vectors=((1.0, 0.0),), prompt_tokens=3)
    handle = _Answers(Refused(broke, replica="r1", in_flight=True), Refused(broke, replica="r2", in_flight=True),
                      answer)
    backend = HandleBackend(handle)  # type: ignore[arg-type]
    backend._loads = lambda: {r: ReplicaLoad() for r in ("r1", "r2", "r3")}  # type: ignore[method-assign]
    with pytest.raises(RequestQuarantined, match="on replica r2"):
        await backend.embed(_request("POISON"))
    with pytest.raises(RequestQuarantined, match="held back"):
        await backend.embed(_request("POISON"))
    assert len(handle.calls) == 2


class _PoisonedEmbedder(FakeEngine):
    """Dies whenever an input holding POISON reaches it."""

    async def embed(self, request_id, prompt_token_ids, dimensions):
        if b"POISON" in bytes(prompt_token_ids):
            self.kill()
        return await super().embed(request_id, prompt_token_ids, dimensions)


async def test_an_embedding_that_breaks_the_restarted_engine_too_is_held_back():
    from app.host.resuming_host import ResumingHost

    model = embed_config(engine={"max_model_len": MAX_MODEL_LEN}).models[0]
    host = ResumingHost(model, _PoisonedEmbedder(max_model_len=MAX_MODEL_LEN), ServiceConfig(),
                        engine_factory=lambda: _PoisonedEmbedder(max_model_len=MAX_MODEL_LEN))
    with pytest.raises(RequestQuarantined):
        await asyncio.wait_for(host.embed(_request("POISON")), 30)
    await until(lambda: host.supervisor.state.name == "SERVING", what="the second restart done")
    assert host.supervisor.restarts_total == 2  # not a third, which would leave the replica to Serve
    assert (await host.embed(_request("fine"))).vectors

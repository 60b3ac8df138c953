"""Two models from one config, each in its own engine deployment, behind a separate ingress that
routes by `model`: the default model for generation, and the same weights as an embedding model (vLLM's pooling
runner), so /v1/embeddings runs on the real engine here without a stack of its own. Its own stack (the
session's main stack serves one model), started with
`--serve-proxy`: HTTP goes through Ray Serve's proxy, as under KubeRay, so that path is exercised
for real too (the main stack's replica listens itself)."""

from __future__ import annotations

import math
import os

import openai
import pytest

from tests.support.engine_procs import engine_cores
from tests.support.service import (
    API_KEY,
    MODEL,
    SECOND_MODEL,
    base_config,
    free_port,
    running_stack,
    with_second_model,
)

pytestmark = [pytest.mark.integration, pytest.mark.stack("own")]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    config = with_second_model(base_config(free_port(), short_clocks=False))
    with running_stack(tmp_path_factory.mktemp("multi"), config, extra_args=("--serve-proxy",)) as svc:
        yield svc


@pytest.fixture(scope="module")
def multi_client(multi):
    with openai.OpenAI(base_url=f"{multi.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


def test_both_models_are_listed(multi_client):
    assert [m.id for m in multi_client.models.list().data] == [MODEL, SECOND_MODEL]
    assert multi_client.models.retrieve(SECOND_MODEL).model_extra["max_model_len"] == 1024


def test_requests_are_routed_by_model_with_each_models_limits(multi, multi_client):
    before = {m: multi.stats(m)["engine"]["prompt_tokens_total"] for m in (MODEL, SECOND_MODEL)}
    r = multi_client.embeddings.create(model=SECOND_MODEL, input="What is the capital of France?")
    assert r.model == SECOND_MODEL and len(r.data) == 1
    after = {m: multi.stats(m)["engine"]["prompt_tokens_total"] for m in (MODEL, SECOND_MODEL)}
    assert after[MODEL] == before[MODEL]  # only the embedding model's engine worked
    assert multi.stats(SECOND_MODEL)["admission"]["in_system"] == 0

    with pytest.raises(openai.BadRequestError) as err:  # the second model's own limit
        multi_client.embeddings.create(model=SECOND_MODEL, input=["a", "b", "c", "d", "e"])
    assert err.value.body["param"] == "input" and "at most 4" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:  # each model serves its own runner's routes
        multi_client.chat.completions.create(model=SECOND_MODEL, messages=QUESTION, max_tokens=5)
    assert err.value.body["param"] == "model" and SECOND_MODEL in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        multi_client.embeddings.create(model=MODEL, input="x")
    assert err.value.body["param"] == "model" and MODEL in err.value.body["message"]
    r = multi_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
    assert r.model == MODEL and "Paris" in r.choices[0].message.content


HIDDEN_SIZE = 576  # SmolLM2-135M's hidden size: the converted model's embedding is its last hidden state


def _cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


def test_embeddings_on_the_real_engine_through_the_sdk(multi, multi_client):
    texts = ["The capital of France is Paris.", "Bananas are yellow.", "The capital of France is Paris."]
    r = multi_client.embeddings.create(model=SECOND_MODEL, input=texts, encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2] and r.object == "list" and r.id.startswith("embd-")
    vectors = [d.embedding for d in r.data]
    assert all(len(v) == HIDDEN_SIZE for v in vectors)
    assert all(abs(math.hypot(*v) - 1.0) < 1e-3 for v in vectors)  # vLLM's pooler L2-normalizes
    assert _cosine(vectors[0], vectors[2]) > 0.9999  # the same input, the same vector (batched together)
    assert _cosine(vectors[0], vectors[1]) < 0.99  # different inputs differ
    tokens, other = (_tokenize(multi, text) for text in texts[:2])
    assert r.usage.prompt_tokens == r.usage.total_tokens == 2 * tokens["count"] + other["count"]

    # The SDK's default is base64 (decoded to floats by the SDK): the same vector as the float answer.
    b64 = multi_client.embeddings.create(model=SECOND_MODEL, input=texts[0])
    assert _cosine(b64.data[0].embedding, vectors[0]) > 0.9999
    # Token ids in: the vector of the string they spell.
    by_ids = multi_client.embeddings.create(model=SECOND_MODEL, input=tokens["tokens"], encoding_format="float")
    assert _cosine(by_ids.data[0].embedding, vectors[0]) > 0.9999
    assert by_ids.usage.prompt_tokens == tokens["count"]

    with pytest.raises(openai.BadRequestError) as err:  # SmolLM2 is no Matryoshka model: vLLM's refusal
        multi_client.embeddings.create(model=SECOND_MODEL, input="x", dimensions=64)
    assert err.value.body["param"] == "dimensions" and "Matryoshka" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:  # out of the vocabulary: the engine's check
        multi_client.embeddings.create(model=SECOND_MODEL, input=[[1, 10**9]])
    assert err.value.body["param"] == "input" and "vocabulary" in err.value.body["message"]
    after = multi.stats(SECOND_MODEL)  # every answer above has come back: nothing left in the engine or the queue
    assert after["engine"]["running"] == 0 and after["admission"]["in_system"] == 0


def test_hostile_embeddings_bodies_on_the_real_engine(multi):
    """The unit suite's hostile /v1/embeddings list (tests/support/hostile.py), once against the real engine: each a
    client error naming its parameter (never a 5xx or a hang), and the engine healthy and empty afterwards."""
    import httpx

    from tests.support.hostile import CASE_TIMEOUT_S, check_outcome, embedding_cases, request_args

    with httpx.Client(base_url=multi.base_url, headers=multi.headers, timeout=CASE_TIMEOUT_S) as c:
        for case in embedding_cases(SECOND_MODEL):
            r = c.post(case.path, content=case.body, **request_args(case))
            check_outcome(case, r.status_code, r.headers.get("content-type", ""), r.content)
        assert c.post("/v1/embeddings", json={"model": SECOND_MODEL, "input": "still fine"}).status_code == 200
        assert c.get("/health").status_code == 200
    after = multi.stats(SECOND_MODEL)
    assert after["engine"]["running"] == 0 and after["admission"]["in_system"] == 0 and after["healthy"]


def _tokenize(service, text: str) -> dict:
    import httpx

    r = httpx.post(f"{service.base_url}/tokenize", headers=service.headers, timeout=30,
                   json={"model": SECOND_MODEL, "prompt": text})
    r.raise_for_status()
    return r.json()


def test_stream_disconnect_is_aborted_across_the_ingress_hop(multi):
    """In this topology tokens cross a Ray handle; a client that leaves must still stop the engine."""
    import httpx

    before = multi.stats()["engine"]["generation_tokens_total"]
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=multi.base_url, headers=multi.headers, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen >= 3:
                    break
    idle = multi.wait_idle(timeout_s=15)
    assert idle["engine"]["running"] == 0 and idle["admission"]["in_system"] == 0
    assert idle["engine"]["generation_tokens_total"] - before < 1000


def _serve_proxies(service) -> list[str]:
    import psutil

    return [p.name() for p in psutil.Process(service.proc.pid).children(recursive=True) if "ProxyActor" in p.name()]


def test_http_goes_through_the_serve_proxy_when_asked(multi):
    # (Without --serve-proxy a single replica listens itself: test_operations.py, on the shared stack. This module
    # uses no shared stack, so it runs after that stack stopped and its two engines have the cores to themselves.)
    assert _serve_proxies(multi), "--serve-proxy: Serve's HTTP proxy answers"
    assert "HTTP answered by the Serve proxy" in multi.log_path.read_text(errors="replace")


def _compute_cores(service) -> list[set[int]]:
    """The cores each model's engine computes on: its EngineCore's main thread (on the CPU the EngineCore computes
    itself, app/engine/cpu/openmp.py binding it), found as `engine_cores` finds them, not by vLLM's process title (a
    CI run of 2026-12-02 found none titled VLLM::EngineCore)."""
    return [set(os.sched_getaffinity(core.pid)) for model in (MODEL, SECOND_MODEL)
            for core in engine_cores(service, model)]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_engines_on_one_host_compute_on_cores_of_their_own(multi):
    planned = [set(multi.stats(m)["engine"]["compute_cores"]) for m in (MODEL, SECOND_MODEL)]
    assert all(planned) and not planned[0] & planned[1], planned  # app/engine/cpu/claims.py
    bound = _compute_cores(multi)
    assert len(bound) == 2 and not bound[0] & bound[1], bound

"""Engine death: in-flight requests end cleanly, health says so, Ray Serve replaces the replica.

It kills the EngineCore with SIGKILL, so it takes the session's stack after every test that shares it
(`own_service`, tests/support/stacks.py), and leaves the stack healthy again."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.support import sse
from tests.support.engine_procs import engine_cores
from tests.support.service import MODEL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.stack("spare")]

RECOVERY_TIMEOUT_S = 300
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_engine_killed_mid_stream_ends_requests_and_recovers(own_service, own_http):
    service, http = own_service, own_http
    cores = engine_cores(service)
    assert len(cores) == 1, cores
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 1000, "ignore_eos": True, "temperature": 0}

    non_stream: dict = {}

    def _non_stream():
        non_stream["response"] = httpx.post(f"{service.base_url}/v1/chat/completions", json=body,
                                            headers=service.headers, timeout=120)

    waiter = threading.Thread(target=_non_stream)
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=120) as c:
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            raw = ""
            chunks = r.iter_text()
            while raw.count("data: ") < 3:
                raw += next(chunks)
            waiter.start()
            wait_until(lambda: service.stats()["engine"]["running"] == 2, timeout_s=60, interval_s=0.1,
                       what="the non-streaming request in the engine beside the stream")
            killed_at = time.monotonic()
            cores[0].kill()  # SIGKILL the engine process
            for part in chunks:
                raw += part
    ended_s = time.monotonic() - killed_at
    events = sse.parse(raw)
    assert events[-1] == "[DONE]"
    assert "error" in events[-2] and events[-2]["error"]["type"] == "service_unavailable", events[-2]
    waiter.join(timeout=60)
    assert not waiter.is_alive(), "the non-streaming request hung after the engine died"
    resp = non_stream["response"]
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "service_unavailable"
    print(f"in-flight stream ended {ended_s:.2f} s after the kill")

    saw_unhealthy = False
    refused_s = 0.0  # connections refused: the dead replica has stopped listening, its replacement not yet
    recovered_s = None
    while time.monotonic() - killed_at < RECOVERY_TIMEOUT_S:
        try:
            # With one replica, which listens itself, there is a gap of a few seconds between Serve stopping the
            # dead replica and the new one listening, in which connections are refused; then the new replica
            # answers 503 "starting" until its engine is loaded.
            if httpx.get(f"{service.base_url}/health", timeout=5).status_code == 503:
                saw_unhealthy = True
        except httpx.ConnectError:
            refused_s += 1
        except httpx.TimeoutException:
            pass
        try:
            r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "temperature": 0,
                                                        "max_tokens": 20}, timeout=30)
            if r.status_code == 200 and saw_unhealthy:
                assert "Paris" in r.json()["choices"][0]["message"]["content"]
                recovered_s = time.monotonic() - killed_at
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)  # the poll interval of this bounded wait for the replacement (it also counts refused_s)
    print(f"connections refused for about {refused_s:.0f} s during the replacement")
    assert saw_unhealthy, "/health never reported the dead engine"
    assert recovered_s is not None, f"no successful answer within {RECOVERY_TIMEOUT_S} s of the kill"
    print(f"service answered again {recovered_s:.1f} s after the engine was killed")
    assert httpx.get(f"{service.base_url}/health", timeout=10).status_code == 200
    assert len(engine_cores(service)) == 1  # the dead engine was replaced, not duplicated

"""Engine death at the default config (one replica serving HTTP itself): the replica restarts its engine in place,
and the requests it had in flight wait for the new engine and continue on it (app/host/resuming_host.py); a request
that arrives meanwhile is refused at once with a 503 and Retry-After.

It kills the EngineCore with SIGKILL, so it takes the session's stack after every test that shares it
(`own_service`, tests/support/stacks.py), and leaves the stack healthy again."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from loadkit.long_stream import LongStream
from tests.support.engine_procs import engine_cores
from tests.support.service import API_KEY, MODEL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.stack("spare")]

RESTART_TIMEOUT_S = 300
STORY = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 128, "temperature": 0}


def test_engine_killed_mid_answer_costs_no_request_and_both_continue_on_the_restarted_engine(own_service, own_http):
    service, http = own_service, own_http
    cores = engine_cores(service)
    assert len(cores) == 1, cores
    body = {"model": MODEL, **STORY, "ignore_eos": True}
    reference = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]

    plain: dict = {}

    def _plain() -> None:
        plain["response"] = httpx.post(f"{service.base_url}/v1/chat/completions", json=body,
                                       headers=service.headers, timeout=RESTART_TIMEOUT_S)

    stream = LongStream(service.base_url, API_KEY, MODEL, **STORY, extra_body={"ignore_eos": True})
    stream.start()
    wait_until(lambda: stream.chunks >= 3, timeout_s=120, interval_s=0.1, what="the stream under way")
    waiter = threading.Thread(target=_plain)
    waiter.start()
    wait_until(lambda: service.stats()["engine"]["running"] == 2, timeout_s=60, interval_s=0.1,
               what="the plain request in the engine beside the stream")
    killed_at = time.monotonic()
    cores[0].kill()  # SIGKILL the engine process
    # Meanwhile a new request is refused at once, saying when to come back (the SDKs retry after that delay).
    wait_until(lambda: httpx.get(f"{service.base_url}/health", timeout=10).status_code == 503, timeout_s=60,
               interval_s=0.1, what="/health saying the engine restarts")
    refused = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                                      "max_tokens": 2})
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1, (refused.headers, refused.text)
    assert refused.json()["error"]["type"] == "service_unavailable", refused.text
    stream.join(timeout=RESTART_TIMEOUT_S)
    waiter.join(timeout=RESTART_TIMEOUT_S)
    ended_s = time.monotonic() - killed_at
    assert not stream.is_alive() and not waiter.is_alive(), "a request hung after the engine died"
    assert stream.whole() is None, stream.whole()  # finish "length" at 128 tokens, no error event
    resp = plain["response"]
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 128
    assert answer["usage"]["prompt_tokens"] == stream.usage.prompt_tokens  # the prompt once, not a continuation's
    print(f"both requests ended whole {ended_s:.1f} s after the kill; the stream identical to the undisturbed "
          f"greedy answer: {stream.text == reference}; the plain one: "
          f"{answer['choices'][0]['message']['content'] == reference}")

    after = engine_cores(service)
    assert len(after) == 1 and after[0].pid != cores[0].pid, after  # replaced in place, not duplicated
    assert httpx.get(f"{service.base_url}/health", timeout=10).status_code == 200
    metrics = http.get("/metrics").text
    resumed = [ln for ln in metrics.splitlines() if ln.startswith("app_requests_migrated_total{") and
               'outcome="resumed"' in ln]
    assert resumed and float(resumed[0].rsplit(" ", 1)[1]) >= 1, resumed  # the stream's one choice at least


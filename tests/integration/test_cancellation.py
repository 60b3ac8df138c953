"""A client that goes away stops the engine's work: proven from the engine's own counters."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.service import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]

LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 1000, "ignore_eos": True, "temperature": 0}


def _generated(service) -> int:
    return service.stats()["engine"]["generation_tokens_total"]


def _assert_engine_stopped(service, before: int) -> None:
    after_idle = service.wait_idle(timeout_s=15)
    assert after_idle["engine"]["running"] == 0, after_idle
    assert after_idle["admission"]["in_system"] == 0, after_idle
    settled = _generated(service)
    # The behaviour under test is an absence (no more tokens), which only shows over a span of time: at this
    # engine's pace (about 30 tokens/s for one request) a request still running would move the counter in 2 s.
    time.sleep(2)
    assert _generated(service) == settled, "the engine kept generating after the client left"
    assert settled - before < 1000, "the request ran to completion instead of being aborted"


def test_stream_disconnect_aborts_engine_request(service):
    before = _generated(service)
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            seen = 0
            for line in lines:
                if line.startswith("data: "):
                    seen += 1
                if seen >= 5:
                    break
            assert service.stats()["engine"]["running"] == 1  # it really was generating
        # leaving the block closes the connection mid-stream
    _assert_engine_stopped(service, before)


def test_non_stream_disconnect_aborts_engine_request(service):
    before = _generated(service)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{service.base_url}/v1/chat/completions", json=LONG, headers=service.headers, timeout=3)
    _assert_engine_stopped(service, before)

"""Ctrl-C drains: the request in flight finishes, new ones get 503, then every process is gone.

Last file of the session: it stops the shared service."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.integration.conftest import MODEL, service_processes
from tests.support import sse

pytestmark = pytest.mark.integration


def test_ctrl_c_drains_then_leaves_no_process(service):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 150, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=120) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            chunks = r.iter_text()
            raw = next(chunks)
            os.killpg(service.proc.pid, signal.SIGINT)  # Ctrl-C
            time.sleep(1.0)
            refused = httpx.post(f"{service.base_url}/v1/chat/completions", headers=service.headers, timeout=30,
                                 json={**body, "stream": False, "max_tokens": 5})
            for part in chunks:
                raw += part
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["type"] == "service_unavailable"
    events = sse.parse(raw)
    assert events[-1] == "[DONE]"
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if e.get("choices")]
    assert finishes[-1] == "length", "the in-flight stream was cut off instead of drained"

    assert service.proc.wait(timeout=120) == 0
    deadline = time.monotonic() + 20
    while service_processes(service.started_at) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert service_processes(service.started_at) == []

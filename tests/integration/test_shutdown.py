"""Ctrl-C drains: the request in flight finishes, new ones get 503, then every process is gone.

It stops its stack, so it takes the session's stack last of all that use it (`own_service`,
tests/support/stacks.py); a test after it that asked for that stack would get a new one."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from loadkit.service import describe
from tests.support import sse
from tests.support.service import MODEL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.stack("spare-stopped")]


def _draining(service) -> bool:
    """The service refuses new work: a cheap route answers 503 (the Gate refuses all but /livez while draining)."""
    try:
        return httpx.get(f"{service.base_url}/v1/models", headers=service.headers, timeout=10).status_code == 503
    except httpx.HTTPError:
        return False


def test_ctrl_c_drains_then_leaves_no_process(own_service):
    service = own_service
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 150, "ignore_eos": True, "temperature": 0, "stream": True}
    tree = service.group.tree()  # every process of this stack, seen while it runs
    assert len(tree) > 3, tree  # the CLI, Ray's, the replica and its engine at least
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=120) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            chunks = r.iter_text()
            raw = next(chunks)
            os.killpg(service.proc.pid, signal.SIGINT)  # Ctrl-C
            wait_until(lambda: _draining(service), timeout_s=30, interval_s=0.1, what="the service draining")
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
    # This stack's processes only (its loadkit tag, and those seen in its tree): another stack may be running.
    try:
        wait_until(lambda: not service.group.leftovers(tree), timeout_s=20, interval_s=0.5)
    except TimeoutError:
        pytest.fail(f"outlived the service by 20 s: {[describe(p) for p in service.group.leftovers(tree)]}")

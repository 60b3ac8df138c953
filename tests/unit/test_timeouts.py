"""Timeouts over HTTP: a queue wait too long is a 503, a request too long a 504 (or an error event),
and in every case the engine request is aborted and no slot leaks."""

from __future__ import annotations

import asyncio

from app.engine.fake import FakeEngine
from tests.support import sse
from tests.support.fake_stack import MODEL_ID, chat_body, make_config
from tests.support.waiting import until

CHAT = "/v1/chat/completions"
LONG = dict(max_tokens=100, ignore_eos=True)
NOT_JSON = {"content": b"{not json", "headers": {"content-type": "application/json"}}


def slow_engine() -> FakeEngine:
    """A token every 20 ms: a request of k tokens holds its slot for about k * 20 ms."""
    return FakeEngine(max_model_len=256, token_delay_s=0.02)


def _assert_clean(stack) -> None:
    stats = stack.host.admission.stats()
    assert stack.engine.running == set()
    assert (stats.in_system, stats.running, stats.waiting) == (0, 0, 0)


async def test_non_stream_past_request_timeout_is_504_and_aborted(make_stack):
    stack = make_stack(make_config(service={"request_timeout_s": 0.3}), slow_engine())
    r = await stack.client.post(CHAT, json=chat_body(**LONG))
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "request_timeout"
    assert len(stack.engine.aborted) == 1
    _assert_clean(stack)


async def test_stream_past_request_timeout_ends_with_error_event_and_done(make_stack):
    stack = make_stack(make_config(service={"request_timeout_s": 0.3}), slow_engine())
    r = await stack.client.post(CHAT, json=chat_body(stream=True, **LONG))
    assert r.status_code == 200
    events = sse.parse(r.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "request_timeout"
    assert len([e for e in events[:-2] if "choices" in e]) >= 3  # it really streamed before the deadline
    assert len(stack.engine.aborted) == 1
    _assert_clean(stack)


async def test_queue_wait_past_queue_timeout_is_503_with_retry_after(make_stack):
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 2, "queue_timeout_s": 0.2})
    stack = make_stack(config, slow_engine())
    holder = asyncio.create_task(stack.client.post(CHAT, json=chat_body(max_tokens=40, ignore_eos=True)))
    await stack.engine.wait_running(1)  # the holder has the one slot, for 40 tokens: longer than the queue timeout
    waited = await stack.client.post(CHAT, json=chat_body(max_tokens=5))
    assert waited.status_code == 503
    assert waited.json()["error"]["code"] == "queue_timeout"
    assert int(waited.headers["retry-after"]) >= 1
    assert (await holder).status_code == 200
    assert stack.host.admission.stats().refused_queue_timeout == 1
    _assert_clean(stack)


async def test_refusal_does_no_work(make_stack):
    """A full queue refuses before the prompt is rendered or the engine is called."""
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0})
    engine = slow_engine()
    stack = make_stack(config, engine)
    rendered = []
    original = engine.render_chat
    engine.render_chat = lambda messages: rendered.append(1) or original(messages)
    holder = asyncio.create_task(stack.client.post(CHAT, json=chat_body(max_tokens=20, ignore_eos=True)))
    await engine.wait_running(1)
    refused = await stack.client.post(CHAT, json=chat_body(content="x" * 100_000))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    assert len(rendered) == 1  # only the holder's prompt was ever rendered
    assert (await holder).status_code == 200
    _assert_clean(stack)


async def test_ingress_refuses_past_capacity_without_calling_the_replica(make_stack):
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 1})
    stack = make_stack(config, slow_engine())
    capacity = stack.app.state.ingress.capacity
    holders = [asyncio.create_task(stack.client.post(CHAT, json=chat_body(max_tokens=20, ignore_eos=True)))
               for _ in range(2)]
    await stack.engine.wait_running(1)  # one holder in the engine, the other in the replica's queue
    await until(lambda: stack.host.admission.stats().waiting == 1, what="the second holder queued in the replica")
    assert capacity.inflight[MODEL_ID] == 2
    refused = await stack.client.post(CHAT, json=chat_body(stream=True))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    assert int(refused.headers["retry-after"]) >= 1
    assert stack.host.admission.stats().refused_queue_full == 0  # the replica never saw it
    assert [(await h).status_code for h in holders] == [200, 200]
    assert capacity.inflight[MODEL_ID] == 0  # nothing leaked: served, refused, streamed
    r = await stack.client.post(CHAT, json=chat_body(stream=True, max_tokens=3))
    assert r.status_code == 200 and capacity.inflight[MODEL_ID] == 0


async def test_full_service_refuses_before_reading_the_body(make_stack):
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0})
    stack = make_stack(config, slow_engine())
    holder = asyncio.create_task(stack.client.post(CHAT, json=chat_body(max_tokens=20, ignore_eos=True)))
    await stack.engine.wait_running(1)
    # Not even valid JSON: refused for capacity, because the body is never looked at.
    refused = await stack.client.post(CHAT, **NOT_JSON)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    assert (await stack.client.get("/v1/models")).status_code == 200  # other routes are not refused
    assert (await holder).status_code == 200
    bad = await stack.client.post(CHAT, **NOT_JSON)
    assert bad.status_code == 400  # with room again, the body is read and judged

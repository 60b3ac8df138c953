"""The replica's own HTTP server (`HttpListener`): a real uvicorn on a loopback socket, the fake engine behind it."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from app.engine.fake import FakeEngine
from app.http.listener import CannotListen, HttpListener, bind_socket
from app.rayserve.builder import INGRESS_NAME, build_from_config, engine_deployment_name
from loadkit.probe import probe
from tests.support.fake_stack import Stack, chat_body, make_config
from tests.support.waiting import until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def served():
    """A `Stack` (fake engine, tokens every 20 ms) behind an `HttpListener` on a free loopback port."""
    stack = Stack(make_config(), FakeEngine(max_model_len=256, token_delay_s=0.02))
    port = _free_port()
    listener = HttpListener(stack.app, "127.0.0.1", port)
    listener.start()
    try:
        yield stack, f"http://127.0.0.1:{port}", listener
    finally:
        await listener.stop()
        await stack.aclose()


async def _assert_aborted_once(stack) -> None:
    await stack.engine.wait_aborted(count=1)  # the server notices a closed socket on its next write or receive
    assert len(stack.engine.aborted) == 1 and not stack.engine.running
    # The abort runs shielded, in a task of its own; the slot is released once it has completed.
    await until(lambda: stack.host.admission.stats().in_system == 0, what="the admission slot released")


async def test_serves_the_api_and_echoes_the_request_id(served):
    stack, base, _ = served
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        r = await client.post("/v1/chat/completions", json=chat_body(), headers={"X-Request-Id": "trace-7"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    assert r.headers["x-request-id"] == "trace-7"


async def test_a_connection_made_the_moment_the_listener_starts_is_served_not_refused():
    stack = Stack(make_config(), FakeEngine(max_model_len=256))
    port = _free_port()
    listener = HttpListener(stack.app, "127.0.0.1", port)
    listener.start()
    try:
        # Before the event loop has run the server at all: the connection waits in the socket's backlog.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await asyncio.to_thread(conn.recv, 64)
        assert answer.startswith(b"HTTP/1.1 200"), answer
    finally:
        await listener.stop()
        await stack.aclose()


async def test_a_client_that_hangs_up_mid_stream_aborts_the_engine_request(served):
    stack, base, _ = served
    body = chat_body(stream=True, max_tokens=100, ignore_eos=True)
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            while "data:" not in await anext(lines):
                pass
    await _assert_aborted_once(stack)


async def test_a_client_that_gives_up_on_a_non_streaming_request_aborts_it(served):
    """uvicorn cancels nothing itself: the app must watch for the disconnect while the answer is generated."""
    stack, base, _ = served
    async with httpx.AsyncClient(base_url=base, timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/chat/completions", json=chat_body(max_tokens=100, ignore_eos=True))  # ~2 s of tokens
    await _assert_aborted_once(stack)


async def test_stop_releases_the_port(served):
    _, base, listener = served
    await listener.stop()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=base, timeout=2) as client:
            await client.get("/livez")
    bind_socket("127.0.0.1", listener.port, reuse_port=False).close()  # nothing holds it any more


async def test_a_replica_being_stopped_refuses_new_connections_and_finishes_open_ones(served):
    """Serve calls the replica's `__del__` (→ `stop_accepting`) when it stops it; a replacement may share the port."""
    stack, base, listener = served
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        in_flight = asyncio.create_task(client.post("/v1/chat/completions",
                                                    json=chat_body(max_tokens=10, ignore_eos=True)))
        await stack.engine.wait_running(1)
        listener.stop_accepting()
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=base, timeout=2) as fresh:
                await fresh.get("/livez")
        assert (await in_flight).status_code == 200


def test_a_taken_port_is_a_clear_error():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(CannotListen, match=rf"127\.0\.0\.1:{port}.*service\.port"):
            bind_socket("127.0.0.1", port, reuse_port=False)


def test_a_replacement_replica_can_bind_while_the_old_one_still_listens():
    port = _free_port()
    old = bind_socket("127.0.0.1", port, reuse_port=True)
    old.listen()
    try:
        bind_socket("127.0.0.1", port, reuse_port=True).close()
    finally:
        old.close()


def test_the_http_replica_is_always_one_and_may_own_the_port():
    single = build_from_config(make_config(), listen=True)  # one model, one replica: it answers HTTP itself
    assert single._bound_deployment.name == engine_deployment_name(make_config().models[0].id)
    several = build_from_config(make_config(deployment={"num_replicas": 2}), listen=True)
    assert several._bound_deployment.name == INGRESS_NAME  # several replicas: the ingress tier holds the connections


async def test_the_refusal_probe_sees_a_full_service_refuse_at_once():
    """loadkit's refusal probe (scripts/refusal_probe.py; scripts/overload.py runs it beside its load), against a
    listener whose one slot is taken and whose queue has no room."""
    stack = Stack(make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0}),
                  FakeEngine(max_model_len=256, token_delay_s=0.05))
    port = _free_port()
    listener = HttpListener(stack.app, "127.0.0.1", port)
    listener.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            busy = asyncio.create_task(client.post("/v1/chat/completions",
                                                   json=chat_body(max_tokens=60, ignore_eos=True)))
            await stack.engine.wait_running(1)
            # probe for 0.5 s, a request every 20 ms: the busy request holds its slot for 60 tokens of 50 ms
            seen = await asyncio.to_thread(probe, base, stack.config.models[0].id, None, 0.5, 0.02, 10)
            assert (await busy).status_code == 200
    finally:
        await listener.stop()
        await stack.aclose()
    assert len(seen["refused"]) >= 3 and not seen["served"] and not seen["other"], {k: len(v) for k, v in seen.items()}
    assert len(seen["livez"]) == len(seen["refused"])

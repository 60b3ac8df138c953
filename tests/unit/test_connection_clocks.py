"""Every connection has a clock, on a real socket: the replica's own listener (`HttpListener`) against
clients that connect and say nothing, drip their headers, send a header block without end, never read
their stream, or keep opening connections. Short timeouts make each clock run out quickly."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

from app.fake_engine import FakeEngine
from app.http_listener import HttpListener
from tests.support.fake_stack import Stack, chat_body, make_config
from tests.support.waiting import until

CLOCKS = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "write_stall_timeout_s": 0.5, "max_connections": 8,
          "keep_alive_timeout_s": 1, "max_header_bytes": 4096}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def listening():
    """A fake-engine stack (a token every 1 ms, contexts long enough to stream for a while) behind a
    listener with short clocks."""
    config = make_config(service=CLOCKS, engine={"max_model_len": 8192}, limits={"max_tokens": 4096})
    stack = Stack(config, FakeEngine(max_model_len=8192, token_delay_s=0.001))
    port = _free_port()
    listener = HttpListener(stack.app, "127.0.0.1", port, config.service)
    listener.start()
    try:
        yield stack, port
    finally:
        await listener.stop()
        await stack.aclose()


async def _open(port: int, rcvbuf: int | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window stays small
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def _closed_by_server(reader: asyncio.StreamReader, timeout_s: float = 10) -> bytes:
    """Everything the server sent until it closed (or reset) the connection."""
    data = b""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk


def _status_and_body(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(listening):
    _, port = listening
    reader, writer = await _open(port)
    raw = await _closed_by_server(reader)
    status, body = _status_and_body(raw)
    assert status == 408 and body["error"]["code"] == "client_timeout"
    writer.close()


async def test_headers_dripped_a_byte_at_a_time_are_cut_off(listening):
    _, port = listening
    reader, writer = await _open(port)
    request = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    async def drip() -> None:
        for byte in request:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.02)  # the slowloris pace is the behaviour under test
    dripping = asyncio.ensure_future(drip())
    raw = await _closed_by_server(reader)
    dripping.cancel()
    assert _status_and_body(raw)[0] == 408
    writer.close()


async def test_a_header_block_over_the_limit_is_refused_as_it_arrives(listening):
    _, port = listening
    reader, writer = await _open(port)
    writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
    for _ in range(4):  # 4 x 2 KB of one header, never ended: refused once 4096 bytes are in
        writer.write(b"X-Big: " + b"b" * 2048 + b"\r\n")
    await writer.drain()
    status, body = _status_and_body(await _closed_by_server(reader))
    assert status == 431 and body["error"]["code"] == "headers_too_large"
    writer.close()


async def test_a_stream_whose_client_never_reads_is_cut_off_and_its_engine_request_aborted(listening):
    stack, port = listening
    reader, writer = await _open(port, rcvbuf=4096)
    body = json.dumps(chat_body(stream=True, max_tokens=4000, ignore_eos=True)).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    await stack.engine.wait_running(1)
    # Never read: the kernel buffers fill, the server's writes stall, and after write_stall_timeout_s it lets go.
    await stack.engine.wait_aborted(count=1, timeout_s=30)
    await until(lambda: stack.host.admission.stats().in_system == 0, what="the slot released")
    assert not stack.engine.running
    writer.close()


async def test_connections_beyond_the_cap_are_reset_at_once_and_the_rest_still_served(listening):
    _, port = listening
    idle = [await _open(port) for _ in range(CLOCKS["max_connections"])]
    extra_reader, extra_writer = await _open(port)
    assert await _closed_by_server(extra_reader, timeout_s=2) == b""  # reset, nothing parsed or answered
    extra_writer.close()
    for _, w in idle:
        w.close()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        async def served() -> bool:
            try:
                return (await client.get("/livez")).status_code == 200
            except httpx.TransportError:  # the closed idle ones may not have been noticed yet
                return False
        await until(served, timeout_s=10, interval_s=0.05, what="a new connection served")


async def test_an_idle_keep_alive_connection_is_closed(listening):
    _, port = listening
    reader, writer = await _open(port)
    writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    raw = await _closed_by_server(reader)  # one answer, then the keep-alive clock closes the connection
    assert raw.startswith(b"HTTP/1.1 200") and raw.count(b"HTTP/1.1") == 1
    writer.close()


async def test_a_body_still_arriving_after_its_413_is_not_taken_for_headers(listening):
    _, port = listening
    reader, writer = await _open(port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"a" * 65536
    for _ in range(18):  # 1.2 MB in chunks, over max_body_bytes (1 MB): refused while the rest still comes
        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 413"), head
    writer.close()

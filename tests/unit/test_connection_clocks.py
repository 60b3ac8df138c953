"""Every connection has a clock, on a real socket: the replica's own listener (`HttpListener`) against
clients that connect and say nothing, drip their headers, send a header block without end, never read
their stream, or keep opening connections. Short timeouts make each clock run out quickly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import httpx
import pytest

from app.engine.fake import FakeEngine
from app.http.listener import HttpListener
from tests.support.fake_stack import Stack, chat_body, make_config
from tests.support.waiting import until

CLOCKS = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "write_stall_timeout_s": 0.5, "max_connections": 8,
          "max_connections_per_peer": 8, "keep_alive_timeout_s": 1, "max_header_bytes": 4096}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def listening():
    """A fake-engine stack (a token every 1 ms, contexts long enough to stream for a while) behind a
    listener with short clocks."""
    async with _listening(token_delay_s=0.001) as stacked:
        yield stacked


@pytest.fixture
async def listening_slowly():
    """As `listening`, with a token every 0.2 s: some 1.5 KB/s of stream, so asyncio's flow control (which
    pauses only once ~190 KB of buffers are full) would take minutes to notice a client that stopped reading."""
    async with _listening(token_delay_s=0.2) as stacked:
        yield stacked


@contextlib.asynccontextmanager
async def _listening(token_delay_s: float, **clocks: float):
    config = make_config(service={**CLOCKS, **clocks}, engine={"max_model_len": 8192}, limits={"max_tokens": 4096})
    stack = Stack(config, FakeEngine(max_model_len=8192, token_delay_s=token_delay_s))
    port = _free_port()
    listener = HttpListener(stack.app, "127.0.0.1", port, config.service)
    listener.start()
    await until(lambda: listener._server is not None and listener._server.started, what="the listener serving")
    try:
        yield stack, port
    finally:
        await listener.stop()
        await stack.aclose()


async def _open(port: int, rcvbuf: int | None = None, source: str = "") -> tuple[asyncio.StreamReader,
                                                                             asyncio.StreamWriter]:
    sock = socket.socket()
    if source:
        sock.bind((source, 0))
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


async def test_headers_that_arrived_while_the_loop_was_late_are_read_not_refused(listening, monkeypatch):
    """The header clock runs out while the request's bytes wait unread in the kernel (the replica's event loop was
    blocked, and a loop may run its due timers before it reads its sockets): the request is read and served, not
    refused 408. Here the bytes land exactly when the clock runs out."""
    from app.http import clocks

    _, port = listening
    sock = socket.create_connection(("127.0.0.1", port))
    request = b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    real_unread = clocks.unread

    def sent_as_the_clock_runs_out(server_socket) -> int:
        if not request_sent:
            sock.sendall(request)
            request_sent.append(True)
        return real_unread(server_socket)

    request_sent: list[bool] = []
    monkeypatch.setattr(clocks, "unread", sent_as_the_clock_runs_out)
    await until(lambda: request_sent, timeout_s=10, what="the header clock run out")
    raw = await asyncio.to_thread(_read_all, sock)
    sock.close()
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


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


async def _start_stream(port: int, max_tokens: int = 4000) -> socket.socket:
    """A raw socket (a small receive buffer set before connecting) that has sent a long streaming chat and
    reads nothing unless the test does: an asyncio StreamReader would read ahead into its own buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    body = json.dumps(chat_body(stream=True, max_tokens=max_tokens, ignore_eos=True)).encode()
    await loop.sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


async def test_a_stream_whose_client_never_reads_is_cut_off_and_its_engine_request_aborted(listening):
    stack, port = listening
    sock = await _start_stream(port)
    await stack.engine.wait_running(1)
    # Never read: the client's window closes, it acknowledges nothing more, and after write_stall_timeout_s
    # the server lets go.
    await stack.engine.wait_aborted(count=1, timeout_s=30)
    await until(lambda: stack.host.admission.stats().in_system == 0, what="the slot released")
    assert not stack.engine.running
    sock.close()


async def test_a_slow_stream_is_cut_off_once_its_client_accepts_nothing_not_once_every_buffer_is_full(
    listening_slowly,
):
    """At ~1.5 KB/s the server's own buffers (~190 KB) would take minutes to fill; the client's 8 KB window is
    closed within seconds, and from then on the client acknowledges nothing: cut off write_stall_timeout_s later."""
    stack, port = listening_slowly
    sock = await _start_stream(port)
    await stack.engine.wait_running(1)
    await stack.engine.wait_aborted(count=1, timeout_s=40)
    await until(lambda: stack.host.admission.stats().in_system == 0, what="the slot released")
    sock.close()


async def test_a_stream_whose_client_stops_reading_leaves_the_engine_long_before_the_cut_and_resumes():
    """At the default write-stall clock (30 s) a client that stops reading holds its connection that long, but its
    engine slot only until the delivery clock has seen it accept nothing for `NOT_READING_S` (1 s): then its request
    is out of the engine, still in the system (app/host/pauses.py). Read again, the stream goes on to its end: the
    same answer as the request run without a pause."""
    async with _listening(token_delay_s=0.01, write_stall_timeout_s=30) as (stack, port):
        sock = await _start_stream(port, max_tokens=700)
        await stack.engine.wait_running(1)
        await stack.engine.wait_aborted(count=1, timeout_s=20)
        adm = stack.host.admission
        await until(lambda: (adm.stats().running, adm.stats().aside) == (0, 1), what="out of the engine")
        assert not stack.engine.running
        metrics = (await stack.client.get("/metrics")).text
        assert 'app_requests_aside{model_name="fake-model",replica="local"} 1.0' in metrics
        undisturbed = asyncio.create_task(stack.client.post("/v1/chat/completions",
                                                            json=chat_body(max_tokens=700, ignore_eos=True)))
        loop, raw = asyncio.get_running_loop(), b""
        async with asyncio.timeout(60):
            while not raw.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
                chunk = await loop.sock_recv(sock, 65536)
                assert chunk, "the server closed the stream"
                raw += chunk
        sock.close()
        body = _unchunked(raw.partition(b"\r\n\r\n")[2]).decode()
        assert body.rstrip().endswith("data: [DONE]")
        events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
        streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
        assert not any("error" in e for e in events)
        assert streamed == (await undisturbed).json()["choices"][0]["message"]["content"]


def _unchunked(body: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, body = out + body[:size], body[size + 2:]


async def test_a_client_that_reads_slowly_but_steadily_keeps_its_stream(listening):
    """A reader taking 4 KB every 0.05 s is always behind a producer that writes a token a millisecond, so
    asyncio's flow control stays paused for the whole 4 s (eight stall clocks of 0.5 s); but the client keeps
    accepting bytes. (Its kernel reopens the window in lumps, once half of its buffer is free: reading 2 KB
    every 0.2 s, 0.4 s apart; hence the brisk reader against so short a clock.)"""
    stack, port = listening
    sock = await _start_stream(port)
    await stack.engine.wait_running(1)
    loop, received = asyncio.get_running_loop(), 0
    for _ in range(80):
        received += len(await loop.sock_recv(sock, 4096))
        await asyncio.sleep(0.05)
    assert stack.engine.running and not stack.engine.aborted, "a client that kept reading was cut off"
    assert received > 80_000
    sock.close()
    await stack.engine.wait_aborted(count=1, timeout_s=10)  # hanging up still ends its request


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


async def test_a_large_request_whose_headers_end_across_two_reads_is_served_not_refused_431(listening, monkeypatch):
    """Each read is handed over in two, cut inside the blank line that ends the headers: the 6 KB body that
    follows is the body, not more header bytes over the 4 KB limit."""
    from app.http.clocks import GuardedHttpToolsProtocol

    whole = GuardedHttpToolsProtocol.data_received

    def in_two(self, data: bytes) -> None:
        cut = data.find(b"\r\n\r\n")
        if cut < 0:
            whole(self, data)
        else:
            whole(self, data[: cut + 3])
            whole(self, data[cut + 3 :])

    monkeypatch.setattr(GuardedHttpToolsProtocol, "data_received", in_two)
    _, port = listening
    body = chat_body(max_tokens=2)
    body["messages"][0]["content"] = "x" * 6000
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


async def test_one_peer_cannot_hold_every_connection(make_stack):
    """Issue 27: one client held the whole table with keep-alive sockets. Past its share its new connections are
    reset; another address still gets in (127.0.0.2 is loopback too)."""
    config = make_config(service={**CLOCKS, "max_connections_per_peer": 3})
    stack = make_stack(config=config)
    port = _free_port()
    listener = HttpListener(stack.app, "127.0.0.1", port, config.service)
    listener.start()
    try:
        async def up() -> bool:  # probed from a third address, which holds nothing of the two under test
            try:
                _, writer = await _open(port, source="127.0.0.3")
            except OSError:
                return False
            writer.close()
            return True

        await until(up, timeout_s=10, interval_s=0.02, what="the listener accepting")
        held = [await _open(port) for _ in range(3)]
        for _, w in held:  # each answered once and kept open: the three are in the table
            w.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        for r, _ in held:
            assert (await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
        extra_reader, extra_writer = await _open(port)
        assert await _closed_by_server(extra_reader, timeout_s=2) == b""  # reset, nothing parsed or answered
        extra_writer.close()
        other_reader, other_writer = await _open(port, source="127.0.0.2")
        other_writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(other_reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
        for _, w in [*held, (other_reader, other_writer)]:
            w.close()
    finally:
        await listener.stop()

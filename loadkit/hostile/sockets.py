"""The hostile sockets: the bytes they send (built by hand: no HTTP library would send most of them), one coroutine
per kind (non-reader, idle, slowloris, huge headers), the fleet that holds every socket, and what became of each.
Nothing reconnects. The server's end of a connection is seen from the client (EOF or a reset; for a socket that
must never read, poll() and SO_ERROR only, and one MSG_PEEK at the end) and from the server's connection table
(`released_at`), since a close behind unsent bytes cannot be seen without reading (docs/hostile.md).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import re
import select
import socket
import struct
import termios
import time
from dataclasses import dataclass, field
from typing import Any

from loadkit.hostile.plan import HUGE_FAST, HUGE_SLOW, IDLE, NON_READER, SLOWLORIS, Plan

_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3})")
_HANGUP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0x2000)


# -- the bytes ---------------------------------------------------------------------------------------------------

def request_bytes(method: str, path: str, host: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """A complete HTTP/1.1 request with a Content-Length (the connection is kept alive)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def non_reader_body(model: str, max_tokens: int, n: int = 1, logprobs: int = 0) -> dict[str, Any]:
    """A streaming chat that runs as long as it may: `ignore_eos`, a large `max_tokens`."""
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                            "temperature": 1.0,
                            "messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]}
    if n > 1:
        body["n"] = n
    if logprobs > 0:
        body.update(logprobs=True, top_logprobs=logprobs)
    return body


def non_reader_request(host: str, model: str, api_key: str | None, max_tokens: int, n: int = 1,
                       logprobs: int = 0) -> bytes:
    body = json.dumps(non_reader_body(model, max_tokens, n, logprobs)).encode()
    return request_bytes("POST", "/v1/chat/completions", host,
                         {"Content-Type": "application/json", **auth(api_key)}, body)


class HeaderDrip:
    """A request whose header block never ends, handed out one byte at a time (slowloris)."""

    def __init__(self, host: str):
        self._head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nX-Drip: ".encode("latin-1")
        self.sent = 0

    _CYCLE = b"a" * 50 + b"\r\nX-Drip: "  # after the first lines: an endless run of header lines

    def next_byte(self) -> bytes:
        i, self.sent = self.sent, self.sent + 1
        if i < len(self._head):
            return self._head[i:i + 1]
        k = (i - len(self._head)) % len(self._CYCLE)
        return self._CYCLE[k:k + 1]


def huge_header_block(host: str, total_bytes: int, line_bytes: int = 1000) -> bytes:
    """A GET whose header lines add up to about `total_bytes` (each header `line_bytes` long), then its end."""
    head = f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\n".encode("latin-1")
    count = max(1, (total_bytes - len(head)) // (line_bytes + 2))
    value = b"x" * max(1, line_bytes - 14)
    lines = b"".join(b"X-Pad-%06d: " % i + value + b"\r\n" for i in range(count))
    return head + lines + b"\r\n"


def giant_prompt_body(model: str, prompt_bytes: int) -> dict[str, Any]:
    """A chat whose one message is `prompt_bytes` characters of words: far beyond any context window."""
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    text = (words * (prompt_bytes // len(words) + 1))[:prompt_bytes]
    return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]}


def tokenize_body(model: str, words: int) -> dict[str, Any]:
    """A /tokenize body of `words` words: real tokenizer work, well inside the prompt limit."""
    return {"model": model, "prompt": " ".join(f"word{i % 97}" for i in range(words))}


def status_of(data: bytes) -> int | None:
    """The status of the first response in `data` ('HTTP/1.1 408 ...'), None when there is none."""
    m = _STATUS_LINE.match(data)
    return int(m[1]) if m else None


# -- one socket and what became of it ------------------------------------------------------------------

@dataclass
class SocketRecord:
    kind: str
    index: int
    local_port: int = 0
    opened_at: float | None = None  # monotonic, once connected
    open_error: str = ""  # the connect failed (refused, or reset by the connection cap)
    sent_bytes: int = 0
    answer: int | None = None  # the HTTP status the server wrote before closing (kinds that read)
    closed_at: float | None = None  # the client saw the server end it
    how: str = ""  # eof | reset | broken pipe | pollhup | so_error:<name>
    seen_by_server: bool = False  # present in the listener's connection table at least once
    released_at: float | None = None  # first sample in which the server no longer held it
    end_state: str = ""  # non-readers, at the end: what a non-blocking MSG_PEEK found
    unread_bytes: int | None = None  # non-readers, at the end: bytes waiting in the client's buffer (FIONREAD)
    server_queued: int | None = None  # non-readers, at the end: bytes in the server's kernel send queue for it
    accepted_bytes: int = 0  # non-readers, while open: the most FIONREAD showed (bytes its kernel took in)
    last_accepted_at: float | None = None  # non-readers: when FIONREAD last grew: from then on, it accepts nothing

    @property
    def ended_at(self) -> float | None:
        """When the server ended it, by the first of the two views that saw it."""
        seen = [t for t in (self.closed_at, self.released_at) if t is not None]
        return min(seen) if seen else None

    @property
    def ended_by_server(self) -> bool:
        return self.ended_at is not None

    @property
    def time_to_end(self) -> float | None:
        if self.ended_at is None or self.opened_at is None:
            return None
        return max(0.0, self.ended_at - self.opened_at)

    def cut_after_last_byte(self) -> float | None:
        """Non-readers: from the last byte its kernel accepted (or its connect) to its end."""
        start = self.last_accepted_at or self.opened_at
        if self.ended_at is None or start is None:
            return None
        return max(0.0, self.ended_at - start)

    def accepted_for(self) -> float | None:
        """Non-readers: how long after connecting its kernel still accepted bytes (the server cannot tell
        that from a client that reads)."""
        if self.last_accepted_at is None or self.opened_at is None:
            return None
        return self.last_accepted_at - self.opened_at

    def saw_close(self, how: str, at: float | None = None) -> None:
        if self.closed_at is None:
            self.closed_at, self.how = (time.monotonic() if at is None else at), how


def _how(err: OSError) -> str:
    if isinstance(err, ConnectionResetError):
        return "reset"
    if isinstance(err, BrokenPipeError):
        return "broken pipe"
    return errno.errorcode.get(err.errno or 0, str(err))


async def connect(host: str, port: int, rec: SocketRecord, rcvbuf: int | None = None) -> socket.socket | None:
    """A non-blocking TCP socket connected to (host, port), `rcvbuf` set before the connect (so the window it
    advertises is small from the first segment); None (with `rec.open_error`) when the connect failed."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except OSError as err:
        rec.open_error = _how(err)
        sock.close()
        return None
    rec.local_port, rec.opened_at = sock.getsockname()[1], time.monotonic()
    return sock


async def send(sock: socket.socket, rec: SocketRecord, data: bytes) -> bool:
    """Sends `data`; False (and the close recorded) when the server has ended the connection."""
    try:
        await asyncio.get_running_loop().sock_sendall(sock, data)
        rec.sent_bytes += len(data)
        return True
    except OSError as err:
        rec.saw_close(_how(err))
        return False


async def read_until_closed(sock: socket.socket, rec: SocketRecord, timeout_s: float | None = None) -> bool:
    """Reads (keeping the first status line) until EOF or a reset; True once closed, False after `timeout_s`
    with the connection still open."""
    loop, head = asyncio.get_running_loop(), b""
    while True:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), timeout_s)
        except TimeoutError:
            return False
        except OSError as err:
            rec.saw_close(_how(err))
            return True
        if not data:
            rec.saw_close("eof")
            return True
        if rec.answer is None and len(head) < 64:
            head += data[:64]
            rec.answer = status_of(head)


def hangup(sock: socket.socket) -> str | None:
    """Whether the peer ended the connection, without reading a byte: POLLHUP/POLLRDHUP/POLLERR or a pending
    SO_ERROR; None while it looks open."""
    try:
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except OSError:
        return "closed"
    if err:
        return "reset" if err == errno.ECONNRESET else f"so_error:{errno.errorcode.get(err, err)}"
    poller = select.poll()
    poller.register(sock.fileno(), _HANGUP)
    events = poller.poll(0)
    if not events:
        return None
    mask = events[0][1]
    return "pollerr" if mask & select.POLLERR else "pollhup" if mask & select.POLLHUP else "pollrdhup"


def peek(sock: socket.socket) -> str:
    """One non-blocking `recv(MSG_PEEK)`: 'data pending' | 'eof' | 'reset' | 'open, nothing pending'."""
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return "open, nothing pending"
    except ConnectionResetError:
        return "reset"
    except OSError as err:
        return _how(err)
    return "data pending" if data else "eof"


def unread(sock: socket.socket) -> int | None:
    """Bytes that arrived and were never read (FIONREAD), without reading them."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return None


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


# -- the fleet ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    api_key: str | None
    model: str

    @property
    def host_header(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class Fleet:
    """Every hostile socket of a run: its record, and the open socket while the driver holds it."""

    endpoint: Endpoint
    plan: Plan
    records: list[SocketRecord] = field(default_factory=list)
    socks: dict[int, socket.socket] = field(default_factory=dict)  # id(record) -> socket
    _huge: bytes = b""

    def record(self, kind: str) -> SocketRecord:
        rec = SocketRecord(kind, sum(r.kind == kind for r in self.records))
        self.records.append(rec)
        return rec

    def of(self, kind: str) -> list[SocketRecord]:
        return [r for r in self.records if r.kind == kind]

    def sock(self, rec: SocketRecord) -> socket.socket | None:
        return self.socks.get(id(rec))

    async def _open(self, rec: SocketRecord, rcvbuf: int | None = None) -> socket.socket | None:
        sock = await connect(self.endpoint.host, self.endpoint.port, rec, rcvbuf)
        if sock is not None:
            self.socks[id(rec)] = sock
        return sock

    async def non_reader(self, rec: SocketRecord) -> None:
        sock = await self._open(rec, self.plan.non_reader_rcvbuf)
        if sock is None:
            return
        e, p = self.endpoint, self.plan
        await send(sock, rec, non_reader_request(e.host_header, e.model, e.api_key, p.non_reader_max_tokens,
                                                 p.non_reader_n, p.non_reader_logprobs))
        # and never a read: the fleet's watcher looks at this socket with poll() and SO_ERROR only

    async def idle(self, rec: SocketRecord) -> None:
        sock = await self._open(rec)
        if sock is not None:
            await read_until_closed(sock, rec)

    async def slowloris(self, rec: SocketRecord) -> None:
        sock = await self._open(rec)
        if sock is None:
            return
        drip = HeaderDrip(self.endpoint.host_header)
        while await send(sock, rec, drip.next_byte()):
            # waiting the interval for an answer IS the drip's pace: one header byte every interval
            if await read_until_closed(sock, rec, timeout_s=self.plan.slowloris_interval_s):
                return

    def _huge_block(self) -> bytes:
        if not self._huge:
            self._huge = huge_header_block(self.endpoint.host_header, self.plan.huge_header_bytes)
        return self._huge

    async def huge_fast(self, rec: SocketRecord) -> None:
        sock = await self._open(rec)
        if sock is None:
            return
        await send(sock, rec, self._huge_block())  # fails once the server has refused it and closed
        if rec.closed_at is None:
            await read_until_closed(sock, rec)

    async def huge_slow(self, rec: SocketRecord) -> None:
        sock = await self._open(rec)
        if sock is None:
            return
        block, step = self._huge_block(), self.plan.huge_slow_chunk
        for offset in range(0, len(block), step):
            if not await send(sock, rec, block[offset:offset + step]):
                return
            # the pause between chunks IS the behaviour: a few KB of header every interval
            if await read_until_closed(sock, rec, timeout_s=self.plan.huge_slow_interval_s):
                return
        await read_until_closed(sock, rec)

    def behaviour(self, kind: str):
        return {NON_READER: self.non_reader, IDLE: self.idle, SLOWLORIS: self.slowloris, HUGE_FAST: self.huge_fast,
                HUGE_SLOW: self.huge_slow}[kind]

    def open_non_readers(self) -> list[tuple[SocketRecord, socket.socket]]:
        return [(r, s) for r in self.of(NON_READER) if r.closed_at is None and (s := self.sock(r)) is not None]

    def close(self) -> int:
        """Closes every socket the fleet still holds (a non-reader's unread bytes make its close a reset)."""
        socks = list(self.socks.values())
        close_all(socks)
        self.socks.clear()
        return len(socks)


def start(fleet: Fleet, kinds: tuple[str, ...]) -> list[asyncio.Task]:
    """One task per socket of each kind, in the order given (the first kind's connects go out first)."""
    return [asyncio.create_task(fleet.behaviour(kind)(fleet.record(kind)), name=f"hostile {kind}")
            for kind in kinds for _ in range(fleet.plan.count(kind))]

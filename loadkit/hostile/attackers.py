"""The hostile sockets' behaviours, one coroutine per kind, and the fleet that holds every socket they opened.

- non-reader: a small SO_RCVBUF set before connecting, one streaming chat with a large `max_tokens` and
  `ignore_eos`, then never a read (the fleet watches it without reading: `sockets.hangup`);
- idle: connects and sends nothing;
- slowloris: one header byte every `slowloris_interval_s`, never the end of the headers;
- huge headers: a header block of megabytes, at once or a few KB at a time.
Every kind but the non-reader reads what the server sends, to see its answer (408, 431) and its close.
Nothing reconnects: each socket is opened once, and the report says what the server did with it.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field

from loadkit.hostile.plan import HUGE_FAST, HUGE_SLOW, IDLE, NON_READER, SLOWLORIS, Plan
from loadkit.hostile.sockets import SocketRecord, close_all, connect, read_until_closed, send
from loadkit.hostile.wire import HeaderDrip, huge_header_block, non_reader_request


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

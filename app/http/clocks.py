"""A clock on every phase of an HTTP connection, and a cap on connections: uvicorn's protocol, guarded.

uvicorn (0.54) times only the idle wait between requests (`timeout_keep_alive`). A connection that
never sends its headers, sends them a byte at a time, never finishes its body, or never reads its
response holds its socket (and, for a response, its engine request and KV cache) for ever; and its
parser buffers a header block of any size before the app can answer 431 (docs/hostile.md).

`GuardedHttpToolsProtocol` adds, per connection:
- a cap on open connections per listener: beyond it a new connection is reset at once (no parser, no
  buffer, no task);
- `header_timeout_s` from the first byte of a request (or from connect) until its headers are complete,
  and `max_header_bytes` counted as they arrive: over it, 431 and close, before the block is buffered;
- `body_timeout_s` from the end of the headers until the body has fully arrived;
- `write_stall_timeout_s`: while bytes of a response wait for the client and the client acknowledges
  none of them (the kernel's count, `tcp_delivery`), for that long at most; then the connection is
  dropped, the app sees a disconnect, and the stream's engine request is aborted as for any client that
  hangs up. Checked every `write_stall_timeout_s / 10` (1 s at most) while a request is in flight. Where
  the kernel cannot tell (not Linux), the clock runs while asyncio's flow control is paused instead,
  which starts only once some 190 KiB of buffers are full.
The idle time between requests stays uvicorn's `timeout_keep_alive`.

Each request's ASGI scope carries its connection (`CLIENT_READING` in `extensions`): the colocated replica's host
asks it how long the client has accepted nothing, and takes a stream whose client stopped reading out of the engine
long before the write-stall clock cuts it (app/host/pauses.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.errors import ClientTimeout, HeadersTooLarge, ServiceError
from app.http.tcp_delivery import probe, unread
from app.http.wire_json import dumps

_END_OF_HEADERS = b"\r\n\r\n"
CLIENT_READING = "app.client_reading"  # the scope's extension: {"connection": an `engine.client.ClientReading`}
LATE_LOOP_GRACE_S = 0.1


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    max_connections_per_peer: int
    header_timeout_s: float
    body_timeout_s: float
    write_stall_timeout_s: float
    max_header_bytes: int


def _error_response(err: ServiceError) -> bytes:
    """The whole HTTP response for `err`, in the OpenAI shape, written straight to the transport."""
    body = dumps(err.body())
    return (
        f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}\r\ncontent-type: application/json\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode("ascii") + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the clocks above. `limits` is set on a subclass per listener
    (`protocol_class`), since uvicorn builds each connection's protocol itself."""

    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None  # the one phase clock running: headers or body
        self._stall: asyncio.TimerHandle | None = None  # the paused-transport clock, where the kernel cannot tell
        self._watch: asyncio.TimerHandle | None = None  # the delivery check, while a request is in flight
        self._kernel_counts = True  # False once `probe` said it cannot tell on this platform
        self._acked = -1
        self._progress_at = 0.0  # when the client last acknowledged a byte, or had none waiting
        self._in_headers = True
        self._header_bytes = 0
        self._header_tail = b""
        self._refused = False
        self._peer = ""
        self._grace_given = False  # a phase's clock ran out with bytes unread, and waited a moment once

    @classmethod
    def protocol_class(cls, limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
        return type("GuardedHttpToolsProtocolWithLimits", (cls,), {"limits": limits, "peers": Counter()})

    peers: Counter[str]  # open connections by peer address, per listener

    # -- connections -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if (len(self.connections) >= self.limits.max_connections
                or self.peers[self._peer] >= self.limits.max_connections_per_peer):
            self._refused = True  # reset at once: no parser state, no buffer, no task for it
            self.transport = transport
            transport.abort()
            return
        self.peers[self._peer] += 1
        super().connection_made(transport)
        self._arm_phase(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_phase()
        self._disarm_stall()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._refused:
            return
        self.peers[self._peer] -= 1
        if not self.peers[self._peer]:
            del self.peers[self._peer]
        super().connection_lost(exc)

    # -- requests ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            if self._timer is None:  # the first byte of a request after an idle keep-alive connection
                self._arm_phase(self.limits.header_timeout_s)
            # The block's end may be split across reads: look for it from the last 3 bytes of the previous read.
            seen = self._header_tail + data
            end = seen.find(_END_OF_HEADERS)
            self._header_bytes += len(data) if end < 0 else end + len(_END_OF_HEADERS) - len(self._header_tail)
            self._header_tail = seen[-(len(_END_OF_HEADERS) - 1):]
            if self._header_bytes > self.limits.max_header_bytes:
                limit = self.limits.max_header_bytes
                self._close_with(HeadersTooLarge(f"Request headers exceed the {limit}-byte limit"))
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._arm_phase(self.limits.body_timeout_s)
        super().on_headers_complete()
        self.scope.setdefault("extensions", {})[CLIENT_READING] = {"connection": self}  # before the app's task runs
        if self._watch is None and self._kernel_counts:
            self._progress_at = self.loop.time()
            self._watch_delivery()

    def on_message_complete(self) -> None:
        self._disarm_phase()
        # Whatever arrives after the request's end is the next request's headers. Not at the response's end:
        # a response (a 413, say) can be complete while the client is still sending the body it refused.
        self._in_headers, self._header_bytes, self._header_tail = True, 0, b""
        super().on_message_complete()

    # -- writes ------------------------------------------------------------------------------

    def _watch_delivery(self) -> None:
        self._watch = None
        if self.transport.is_closing():
            return
        delivery = probe(self.transport.get_extra_info("socket"))
        if delivery is None:
            self._kernel_counts = False  # the paused-transport clock takes over
            return
        now = self.loop.time()
        waiting = delivery.queued + self.transport.get_write_buffer_size()
        if waiting == 0 or delivery.acked != self._acked:
            self._acked, self._progress_at = delivery.acked, now
        elif now - self._progress_at >= self.limits.write_stall_timeout_s:
            self._stalled()
            return
        in_flight = self.cycle is not None and not self.cycle.response_complete
        if in_flight or waiting:
            interval = min(1.0, self.limits.write_stall_timeout_s / 10)
            self._watch = self.loop.call_later(interval, self._watch_delivery)

    def stalled_s(self) -> float:
        """Seconds the client has acknowledged none of the bytes waiting for it, as of the last delivery check (0:
        it reads, nothing waits, or the kernel cannot tell)."""
        if not self._kernel_counts or self._acked < 0 or self._progress_at == 0.0:
            return 0.0
        return max(0.0, self.loop.time() - self._progress_at)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall is None and not self._kernel_counts:
            self._stall = self.loop.call_later(self.limits.write_stall_timeout_s, self._stalled)

    def resume_writing(self) -> None:
        self._disarm_stall()
        super().resume_writing()

    def _stalled(self) -> None:
        self._stall = None
        self.transport.abort()  # connection_lost follows: the app sees a disconnect and aborts its request

    # -- clocks ------------------------------------------------------------------------------

    def _arm_phase(self, seconds: float) -> None:
        self._disarm_phase()
        self._grace_given = False
        self._timer = self.loop.call_later(seconds, self._phase_timed_out)

    def _disarm_phase(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _disarm_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _phase_timed_out(self) -> None:
        self._timer = None
        if not self._grace_given and unread(self.transport.get_extra_info("socket")):
            # The bytes are here, unread: this process's loop was late (an event loop runs due timers before it
            # reads its sockets), not the client. Once per phase, a moment to read them before judging.
            self._grace_given = True
            self._timer = self.loop.call_later(LATE_LOOP_GRACE_S, self._phase_timed_out)
            return
        if self._in_headers:
            self._close_with(
                ClientTimeout(f"The request's headers did not arrive within {self.limits.header_timeout_s:g} s")
            )
        else:  # the body did not arrive in time; the app (waiting in receive()) sees a disconnect
            self.transport.abort()

    def _close_with(self, err: ServiceError) -> None:
        if not self.transport.is_closing():
            self.transport.write(_error_response(err))
            self.transport.close()

"""One hostile socket and what became of it: when it opened, what the server answered, when and how the server
ended it.

Two independent ways to see the server end a connection:
- the client's side: a read returning EOF or ECONNRESET (for kinds that may read), or, for a socket that must
  never read, `poll()` for POLLHUP/POLLRDHUP/POLLERR and `SO_ERROR`, which read no data; at the very end one
  non-blocking `recv(MSG_PEEK)` says what is pending (data, EOF, a reset). A server that closes a connection
  whose client reads nothing leaves its unsent bytes and its FIN queued behind them: the client cannot see
  that close without reading, so
- the server's side: the connection is gone from the listening process's open sockets (`released_at`, from
  its connection table, sampled by `server_view`).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import select
import socket
import struct
import termios
import time
from dataclasses import dataclass

from loadkit.hostile.wire import status_of

_HANGUP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0x2000)


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

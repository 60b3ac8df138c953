"""What the kernel knows about a socket's delivery to its peer: bytes the peer acknowledged, bytes not yet.

The write-stall clock needs "has the client accepted any byte lately", and asyncio cannot say: its flow
control pauses only once the kernel's send buffer (64 KiB asked, 128 KiB granted by Linux) and asyncio's
own buffer (64 KiB) are full: minutes of a slow stream (docs/hostile.md). The kernel knows much earlier: TCP_INFO's
`tcpi_bytes_acked` stops growing the moment the peer's receive window is closed, and SIOCOUTQ says the
bytes still waiting for it.

Linux only (TCP_INFO's layout and SIOCOUTQ are Linux's); elsewhere `probe` returns None and the caller
falls back on asyncio's pause.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Any

_SIOCOUTQ = 0x5411  # = TIOCOUTQ: bytes in the send queue, sent but unacknowledged or not yet sent
_FIONREAD = 0x541B  # bytes received and not yet read
_BYTES_ACKED_OFFSET = 120  # struct tcp_info: __u64 tcpi_bytes_acked (Linux 4.1+)
_TCP_INFO_LEN = _BYTES_ACKED_OFFSET + 8


@dataclass(frozen=True)
class Delivery:
    acked: int  # bytes the peer has acknowledged since the connection began
    queued: int  # bytes in the kernel's send queue, not yet acknowledged


def probe(sock: Any) -> Delivery | None:
    """The kernel's count for `sock` (a socket, or asyncio's TransportSocket), or None where it cannot tell."""
    if sock is None or not sys.platform.startswith("linux"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        if len(info) < _TCP_INFO_LEN:
            return None
        (acked,) = struct.unpack_from("Q", info, _BYTES_ACKED_OFFSET)
        queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):  # closed under us, or not a TCP socket
        return None
    return Delivery(acked=acked, queued=queued)


def unread(sock: Any) -> int:
    """Bytes the peer sent that wait, unread, in the kernel's receive queue (0 where it cannot tell)."""
    if sock is None or not sys.platform.startswith("linux"):
        return 0
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), _FIONREAD, b"\0\0\0\0"))[0])
    except (OSError, ValueError):
        return 0

"""What a replica may ask of the connection its answer goes to, where that connection is in the same process.

The colocated replica serves HTTP itself: its connection's delivery clock (app/http/clocks.py) knows when the client
stopped reading long before the write buffers fill, and the host (app/host/pauses.py) then takes the request out of
the engine. Behind another process (Serve's proxy, a separate ingress) there is none to ask.
"""

from __future__ import annotations

from typing import Protocol


class ClientReading(Protocol):
    def stalled_s(self) -> float:
        """Seconds the client has accepted none of the bytes waiting for it (0: it reads, or nothing waits)."""
        ...

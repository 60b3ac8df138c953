"""Lifecycle: the requests in flight at the front door, and whether the service is draining for shutdown."""

from __future__ import annotations

import asyncio


class Lifecycle:
    """Requests in flight, and whether the service is draining for shutdown."""

    def __init__(self) -> None:
        self.inflight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def drain(self, grace_s: float) -> int:
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
        except TimeoutError:
            pass
        return self.inflight

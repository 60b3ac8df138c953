"""Waiting for what a fake engine does, from any event loop or thread: tests wait for a condition on the engine's
state, re-checked on every change of it, never for a fixed time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class EngineWaits:
    """The engine calls `_changed()` on every change of `running`, `aborted` or `started_event`."""

    running: set[str]
    aborted: list[str]
    started_event: threading.Event

    def __init__(self) -> None:
        # Futures of tests waiting for a change, with their loops: woken (thread-safely) on every change.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._waiters_lock = threading.Lock()

    def _changed(self) -> None:
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
        """Return once `condition()` (about this engine's state) is true; re-checked on every change of the
        engine's state. `TimeoutError` naming `what` if it is still false after `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            future = loop.create_future()
            with self._waiters_lock:
                self._waiters.append((loop, future))
            if condition():  # checked after registering, so a change in between is not missed
                future.cancel()
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                future.cancel()
                raise TimeoutError(f"fake engine: not {what or 'true'} within {timeout_s} s; "
                                   f"running={sorted(self.running)} aborted={self.aborted}")
            try:
                await asyncio.wait_for(future, remaining)
            except TimeoutError:
                pass  # checked once more above, then reported

    async def wait_started(self, timeout_s: float = 5.0) -> None:
        await self.wait_until(self.started_event.is_set, timeout_s, "started")

    async def wait_running(self, count: int = 1, timeout_s: float = 5.0) -> None:
        """Until at least `count` requests are inside `generate` at once."""
        await self.wait_until(lambda: len(self.running) >= count, timeout_s, f"{count} request(s) running")

    async def wait_aborted(self, request_id: str | None = None, count: int = 1, timeout_s: float = 5.0) -> None:
        """Until `request_id` was aborted, or (without one) at least `count` aborts happened."""
        if request_id is not None:
            await self.wait_until(lambda: request_id in self.aborted, timeout_s, f"{request_id} aborted")
        else:
            await self.wait_until(lambda: len(self.aborted) >= count, timeout_s, f"{count} abort(s)")


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

"""How late this process's event loop runs: a heartbeat whose overshoot is the stall every request here suffers.

Everything a replica does for its clients (parsing, streaming tokens, refusing, Ray Serve's own health check)
shares one event loop; one request that computes on it (a huge JSON body, a tokenizer call, a response
encoded in one go) delays all of them. The probe sleeps `interval_s` at a time and records how much longer
each sleep took, into `app_event_loop_lag_seconds` (/metrics) and a recent maximum.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from prometheus_client import Histogram

INTERVAL_S = 0.05
_WINDOW_S = 10.0


class LoopLagProbe:
    def __init__(self, histogram: Histogram, interval_s: float = INTERVAL_S):
        self._histogram = histogram
        self._interval_s = interval_s
        self._recent: deque[tuple[float, float]] = deque()  # (when, lag) over the last _WINDOW_S
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Idempotent; must be called on the loop to watch."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="event-loop-lag-probe")

    def recent_max_s(self) -> float:
        return max((lag for _, lag in self._recent), default=0.0)

    async def _run(self) -> None:
        clock = time.perf_counter
        while True:
            before = clock()
            await asyncio.sleep(self._interval_s)
            now = clock()
            lag = max(0.0, now - before - self._interval_s)
            self._histogram.observe(lag)
            self._recent.append((now, lag))
            while self._recent and self._recent[0][0] < now - _WINDOW_S:
                self._recent.popleft()

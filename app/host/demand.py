"""DemandMeter: the output tokens per second one replica served, and those it (or the ingress) refused by time, over a
sliding window: what the autoscaling policy (rayserve/autoscaling.py) adds up as the model's demand. A refusal by
time counts as the output it would have had (`max_tokens` x n, times the share of `max_tokens` requests really use):
demand a count-based policy never sees, since such a request never waits in a queue."""

from __future__ import annotations

import time
from collections import deque

WINDOW_S = 30.0


class DemandMeter:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._seconds: deque[list[float]] = deque()  # [second, served tokens, refused tokens], oldest first

    def _bucket(self, now: float) -> list[float]:
        second = float(int(now))
        if not self._seconds or self._seconds[-1][0] != second:
            self._seconds.append([second, 0.0, 0.0])
        while self._seconds and self._seconds[0][0] <= now - self.window_s:
            self._seconds.popleft()
        return self._seconds[-1]

    def served(self, tokens: float, now: float | None = None) -> None:
        self._bucket(time.monotonic() if now is None else now)[1] += tokens

    def refused(self, tokens: float, now: float | None = None) -> None:
        self._bucket(time.monotonic() if now is None else now)[2] += tokens

    def rates(self, now: float | None = None) -> tuple[float, float]:
        """(served, refused) output tokens per second over the window."""
        now = time.monotonic() if now is None else now
        recent = [b for b in self._seconds if b[0] > now - self.window_s]
        return sum(b[1] for b in recent) / self.window_s, sum(b[2] for b in recent) / self.window_s

"""DemandMeter: the output tokens per second one replica served, and those it (or the ingress) refused by time, over a
sliding window: what the autoscaling policy (scaling/serve_policy.py) adds up as the model's demand. A refusal by
time counts as the output it would have had (`max_tokens` x n, times the share of `max_tokens` requests really use):
demand a count-based policy never sees, since such a request never waits in a queue.

`effective_capacity` is what a replica makes for the mix it serves: a decode-only figure overstated it by a third when
prefill took a third of the engine's time (the simulation's step trace, docs/autoscaling.md), and the policy then
scaled up twice where once would do.
"""

from __future__ import annotations

import time
from collections import deque

# Short: Serve averages each replica's figures over the policy's look-back window (30 s) on top of this; a 30 s window
# here too put the first scale-up 60 s after a step instead of 30 (the simulation's step trace).
WINDOW_S = 10.0


def effective_capacity(decode_capacity: float, prefill_s_per_token: float | None, prompt_per_output: float) -> float:
    """Output tokens per second a replica makes at a full batch when each output token also brings
    `prompt_per_output` prompt tokens to prefill, at `prefill_s_per_token` of the engine's time each."""
    if not prefill_s_per_token or prompt_per_output <= 0 or decode_capacity <= 0:
        return decode_capacity
    return 1.0 / (1.0 / decode_capacity + prefill_s_per_token * prompt_per_output)


class DemandMeter:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        # [second, served tokens, refused tokens], oldest first
        self._seconds: deque[list[float]] = deque()

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

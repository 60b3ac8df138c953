"""The open-loop arrival schedule: when each request of a window is sent, whatever the answers.

Poisson (exponential gaps) or uniform (even gaps), seeded. A Poisson schedule at rate r is the seed's unit-rate
schedule stretched by 1/r, so two systems offered different rates see the same pattern of bursts and lulls.
"""

from __future__ import annotations

import random

KINDS = ("poisson", "uniform")


def arrivals(rate_rps: float, duration_s: float, kind: str = "poisson", seed: int = 0) -> list[float]:
    """Offsets in seconds from the window's start, each in [0, duration_s), in order."""
    if kind not in KINDS:
        raise ValueError(f"arrival schedule {kind!r}: choose from {', '.join(KINDS)}")
    if rate_rps <= 0 or duration_s <= 0:
        return []
    if kind == "uniform":
        out, i = [], 0
        while i / rate_rps < duration_s:
            out.append(i / rate_rps)
            i += 1
        return out
    r, out, t = random.Random(seed), [], 0.0
    while True:
        t += r.expovariate(1.0)  # unit rate, then stretched
        if t / rate_rps >= duration_s:
            return out
        out.append(t / rate_rps)

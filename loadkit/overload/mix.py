"""The overload driver's request mix: 70% short, 30% long, half streaming, about 15% hanging up early; the same
sequence of requests for the same seed, so phases b and c (restarted with the same seed) can be compared."""

from __future__ import annotations

import random

from loadkit.workload import Ask

SEED = 20240611


class Mix:
    """Short: prompt 20-150 tokens, 16-64 out; long: prompt 300-600, 128-256 out; exact output lengths."""

    def __init__(self, seed: int = SEED):
        self._rng = random.Random(seed)
        self._next = 0

    def next(self) -> Ask:
        r = self._rng
        long = r.random() < 0.30
        prompt = r.randint(300, 600) if long else r.randint(20, 150)
        out = r.randint(128, 256) if long else r.randint(16, 64)
        ask = Ask(index=self._next, prompt_tokens=prompt, max_tokens=out, stream=r.random() < 0.5,
                  hangup=r.random() < 0.15, hangup_chunks=r.randint(2, 5), hangup_after_s=r.uniform(1.0, 3.0))
        self._next += 1
        return ask

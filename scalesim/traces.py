"""The load traces: a request rate over time as a multiple of the base load (step 1x -> 4x -> 1x, a ramp up and down,
on/off bursts), and the requests drawn from it (Poisson arrivals, prompt and output lengths), seeded so that every
policy meets the same requests."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from scalesim.replica import Job

DURATION_S = 720.0
STEP_AT_S, STEP_END_S = 120.0, 360.0


@dataclass(frozen=True)
class Workload:
    """Request lengths, uniform in each range; most requests stop before `max_tokens`."""

    name: str
    prompt: tuple[int, int]
    output: tuple[int, int]
    max_tokens: int

    @property
    def mean_output(self) -> float:
        return (self.output[0] + self.output[1]) / 2

    @property
    def output_share(self) -> float:
        return self.mean_output / self.max_tokens


# Chat: a few hundred tokens each way. Documents: long prompts, short answers (summaries, RAG, classification): the
# engine's time goes to prefill, requests are short-lived, and a count of requests in flight stays low.
WORKLOADS = {"chat": Workload("chat", (64, 512), (16, 256), 256),
             "documents": Workload("documents", (1000, 1900), (8, 64), 64)}
PEAK = 4.0


def step(t: float) -> float:
    return PEAK if STEP_AT_S <= t < STEP_END_S else 1.0


def ramp(t: float) -> float:
    up, top, down = 60.0, 360.0, 660.0
    if t < up or t >= down:
        return 1.0
    if t < top:
        return 1.0 + (PEAK - 1.0) * (t - up) / (top - up)
    return PEAK - (PEAK - 1.0) * (t - top) / (down - top)


def bursts(t: float) -> float:
    """30 s at the peak every 120 s, from 60 s on."""
    return PEAK if t >= 60.0 and (t - 60.0) % 120.0 < 30.0 else 1.0


TRACES: dict[str, Callable[[float], float]] = {"step": step, "ramp": ramp, "bursts": bursts}


def arrivals(shape: Callable[[float], float], base_rps: float, workload: Workload, seed: int) -> list[Job]:
    """Poisson arrivals at `base_rps x shape(t)` (by thinning against the peak), each with its own lengths."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    t, peak = 0.0, base_rps * PEAK
    while True:
        t += rng.expovariate(peak)
        if t >= DURATION_S:
            return jobs
        if rng.random() * peak <= base_rps * shape(t):
            jobs.append(Job(arrival=t, prompt=rng.randint(*workload.prompt), max_tokens=workload.max_tokens,
                            output=rng.randint(*workload.output)))

"""How the goodput benchmark loads a system: the closed loop that measures the rate it can serve, and the open-loop
windows offered multiples of that rate on a seeded arrival schedule.

Capacity: `concurrency` clients send the mix back to back, every request streamed; the rate is the output tokens
streamed in the last two thirds of the loop (the first is the ramp) per second, over the mix's mean output length,
tokens counted as they arrive in finished and running requests alike (docs/goodput.md says why), through the same
SDK client as the windows (`vllm bench serve` runs a count of prompts, ramp and drain included). A window sends
each request at its scheduled time whatever the answers (a Poisson schedule at rate r is the seed's unit-rate one
stretched by 1/r: every system sees the same bursts), waits up to `drain_s`, cuts off the rest (timed out), then
settles.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import openai

from loadkit.record import Record
from loadkit.sdk import AttemptLog, send
from loadkit.workload import Ask, PromptMaker

RAMP_SHARE = 1 / 3
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


@dataclass(frozen=True)
class Rate:
    """The rate a system can serve (its "capacity"), as its windows are offered multiples of it."""

    rate_rps: float
    measured: bool  # False: given by --capacity
    completed: int = 0  # requests finished ok in the counted part of the loop
    counted_s: float = 0.0
    output_tok_s: float = 0.0
    concurrency: int = 0
    duration_s: float = 0.0
    not_ok: int = 0  # requests of the loop that ended otherwise than ok
    note: str = ""  # where a rate came from when not from this system's own loop

    def to_dict(self) -> dict:
        return dict(vars(self))


def steady_tokens(records: list[Record], t0: float, duration_s: float) -> tuple[float, float, int]:
    """(output tokens streamed after the ramp, the seconds counted, requests finished ok after the ramp)."""
    start, end = t0 + duration_s * RAMP_SHARE, t0 + duration_s
    ratios = [r.output_tokens / len(r.chunk_times) for r in records
              if r.outcome == "ok" and r.chunk_times and r.output_tokens]
    per_chunk = sum(ratios) / len(ratios) if ratios else 1.0
    tokens = 0.0
    for r in records:
        times = r.chunk_times or []
        ratio = r.output_tokens / len(times) if r.outcome == "ok" and times and r.output_tokens else per_chunk
        tokens += ratio * sum(start <= t <= end for t in times)
    done = sum(r.outcome == "ok" and start <= r.end <= end for r in records)
    return tokens, end - start, done


async def measure(client: openai.AsyncOpenAI, log: AttemptLog, model: str, prompts: PromptMaker, asks: Iterator[Ask],
                  concurrency: int, duration_s: float, mean_output_tokens: float) -> Rate:
    records: list[Record] = []
    t0 = time.monotonic()
    deadline = t0 + duration_s

    async def worker() -> None:
        while time.monotonic() < deadline:
            rec = Record(time.monotonic(), ask=replace(next(asks), stream=True), chunk_times=[])
            records.append(rec)
            await send(client, log, model, prompts, rec)

    await cut_off([asyncio.create_task(worker()) for _ in range(concurrency)], deadline)
    tokens, span, done = steady_tokens(records, t0, duration_s)
    tok_s = tokens / span if span > 0 else 0.0
    return Rate(rate_rps=tok_s / mean_output_tokens if mean_output_tokens > 0 else 0.0, measured=True,
                    completed=done, counted_s=span, output_tok_s=tok_s, concurrency=concurrency,
                    duration_s=duration_s, not_ok=sum(r.outcome not in ("ok", "") and r.end <= deadline
                                                      and "cut off" not in r.detail for r in records))


@dataclass(frozen=True)
class Window:
    asks: list[Ask]
    offsets: list[float]  # seconds from the window's start, one per ask
    duration_s: float
    drain_s: float
    settle_s: float = 5.0


async def open_loop(client: openai.AsyncOpenAI, log: AttemptLog, model: str, prompts: PromptMaker,
                    window: Window) -> list[Record]:
    t0 = time.monotonic()
    tasks: list[asyncio.Task] = []
    records: list[Record] = []
    for ask, offset in zip(window.asks, window.offsets, strict=True):
        delay = t0 + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        rec = Record(time.monotonic(), ask=ask, scheduled=t0 + offset)
        records.append(rec)
        tasks.append(asyncio.create_task(send(client, log, model, prompts, rec)))
    await cut_off(tasks, t0 + window.duration_s + window.drain_s)
    await asyncio.sleep(window.settle_s)
    return records


async def cut_off(tasks: list[asyncio.Task], deadline: float) -> int:
    """Waits for `tasks` until `deadline` (monotonic), then cancels the rest; how many were cut off."""
    if not tasks:
        return 0
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return len(pending)

"""The rate a system can serve, measured before its open-loop windows: a closed loop of `concurrency` clients
(the engine's batch size) sending the same mix back to back for `duration_s`, every request streamed.

The rate is the output tokens the engine streamed in the last two thirds of the loop (the first third is the
ramp: every client starts at once) per second, over the mix's mean output length: in a loop at steady state each
finished request is replaced by a new one, so that rate carries the mix's prefills too. Tokens are counted as
they arrive, in requests that finished and in those still running, so long requests count for the work they got
(a count of completed requests was seen at a quarter of what the engine served: in 30 s only short ones finish).
A chunk is one token, or, where a system batches tokens into chunks, its finished requests' tokens per chunk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import openai

from loadkit.goodput.client import AttemptLog, Record, send
from loadkit.goodput.step import cut_off
from loadkit.goodput.workload import Ask
from loadkit.overload.mix import PromptMaker

RAMP_SHARE = 1 / 3


@dataclass(frozen=True)
class Capacity:
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
                  concurrency: int, duration_s: float, mean_output_tokens: float) -> Capacity:
    records: list[Record] = []
    t0 = time.monotonic()
    deadline = t0 + duration_s

    async def worker() -> None:
        while time.monotonic() < deadline:
            rec = Record(ask=replace(next(asks), stream=True), start=time.monotonic(), chunk_times=[])
            records.append(rec)
            await send(client, log, model, prompts, rec)

    await cut_off([asyncio.create_task(worker()) for _ in range(concurrency)], deadline)
    tokens, span, done = steady_tokens(records, t0, duration_s)
    tok_s = tokens / span if span > 0 else 0.0
    return Capacity(rate_rps=tok_s / mean_output_tokens if mean_output_tokens > 0 else 0.0, measured=True,
                    completed=done, counted_s=span, output_tok_s=tok_s, concurrency=concurrency,
                    duration_s=duration_s, not_ok=sum(r.outcome not in ("ok", "") and r.end <= deadline
                                                      and "cut off" not in r.detail for r in records))

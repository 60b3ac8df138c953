"""The rate a system can serve, measured before its open-loop windows: a closed loop of `concurrency` clients
(the engine's batch size) sending the same mix back to back for `duration_s`.

The rate is the requests completed in the last two thirds of the loop over that time (the first third is the
ramp: every client starts at once and nobody finishes early); what is still running at the end is cut off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

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
    completed: int = 0  # in the counted part of the loop
    counted_s: float = 0.0
    output_tok_s: float = 0.0
    concurrency: int = 0
    duration_s: float = 0.0
    not_ok: int = 0  # requests of the loop that ended otherwise than ok

    def to_dict(self) -> dict:
        return dict(vars(self))


def steady_rate(records: list[Record], t0: float, duration_s: float) -> tuple[int, float, float]:
    """(completed, counted seconds, output tokens/s) of the ok requests that ended after the ramp."""
    start, end = t0 + duration_s * RAMP_SHARE, t0 + duration_s
    done = [r for r in records if r.outcome == "ok" and start <= r.end <= end]
    span = end - start
    return len(done), span, (sum(r.output_tokens for r in done) / span if span > 0 else 0.0)


async def measure(client: openai.AsyncOpenAI, log: AttemptLog, model: str, prompts: PromptMaker, asks: Iterator[Ask],
                  concurrency: int, duration_s: float) -> Capacity:
    records: list[Record] = []
    t0 = time.monotonic()
    deadline = t0 + duration_s

    async def worker() -> None:
        while time.monotonic() < deadline:
            rec = Record(ask=next(asks), start=time.monotonic())
            records.append(rec)
            await send(client, log, model, prompts, rec)

    await cut_off([asyncio.create_task(worker()) for _ in range(concurrency)], deadline)
    completed, span, tok_s = steady_rate(records, t0, duration_s)
    return Capacity(rate_rps=completed / span if span > 0 else 0.0, measured=True, completed=completed,
                    counted_s=span, output_tok_s=tok_s, concurrency=concurrency, duration_s=duration_s,
                    not_ok=sum(r.outcome != "ok" for r in records if r.end <= deadline))

"""One open-loop window: requests sent at their scheduled times whatever the answers, then a drain.

After the last arrival the window waits up to `drain_s` for what is still running; whatever is left then is cut
off (cancelled: its connection closes, and the server is expected to abort it) and counts as timed out, its
client-seconds up to the cut. Then a short settle, so the next window starts on an engine that has let go.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import openai

from loadkit.goodput.client import AttemptLog, Record, send
from loadkit.goodput.workload import Ask
from loadkit.overload.mix import PromptMaker


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
        rec = Record(ask=ask, start=time.monotonic(), scheduled=t0 + offset)
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

"""One system in one round of the goodput run (loadkit.peers.launch starts and stops it, with the bench's commands
and engine settings): warm it up, measure its capacity (unless known), run one open-loop window per rate
multiple, the peak RSS of its whole process tree sampled through every window.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from loadkit.goodput.loops import Rate, Window, arrivals, measure, open_loop
from loadkit.peers import MODEL_ID, Launch, Launchable, Variant, launch
from loadkit.proctree import PeakSampler
from loadkit.record import Record
from loadkit.report import progress
from loadkit.sdk import make_client, send
from loadkit.service import Server
from loadkit.workload import PromptMaker, mean_output_tokens, mix, stream

WARMUPS = 4
INDEX_BLOCK = 100_000  # request indices: one block per window of a run, so no two requests share a prompt
say = progress("goodput")


@dataclass(frozen=True)
class Plan:
    """What every launch of a run shares."""

    at: Launchable
    multiples: list[float]
    duration_s: float
    drain_s: float
    arrivals: str
    seed: int
    client_timeout_s: float
    capacity_concurrency: int
    capacity_duration_s: float
    startup_timeout_s: float
    stop_grace_s: float
    settle_s: float = 5.0


@dataclass
class WindowRun:
    multiple: float
    offered_rps: float
    duration_s: float
    records: list[Record]
    peak_rss_bytes: int


@dataclass
class LaunchRun(Launch):
    """One system in one round: the rate its windows were offered multiples of, and every window."""

    capacity: Rate | None = None  # the rate its windows were offered multiples of
    own_capacity: Rate | None = None  # its own loop's, where that gave nothing and another's rate was used
    windows: list[WindowRun] = field(default_factory=list)


def window_for(plan: Plan, round_: int, step: int, rate_rps: float) -> Window:
    """The same arrivals pattern and requests for every system at a step of a round (seeded by both)."""
    seed = plan.seed + 1000 * round_ + step
    offsets = arrivals(rate_rps, plan.duration_s, plan.arrivals, seed)
    first = (round_ * 16 + step + 1) * INDEX_BLOCK
    return Window(mix(seed, len(offsets), first), offsets, plan.duration_s, plan.drain_s, plan.settle_s)


async def _drive(plan: Plan, base_url: str, prompts: PromptMaker, round_: int, capacity: Rate | None,
                 sampler: PeakSampler, out: LaunchRun, fallback: Rate | None) -> None:
    client, log = make_client(base_url, plan.client_timeout_s)
    try:
        for ask in mix(plan.seed + 999, WARMUPS, first_index=round_ * 16 * INDEX_BLOCK + INDEX_BLOCK // 2):
            await send(client, log, MODEL_ID, prompts, Record(time.monotonic(), ask=ask))
        if capacity is None:
            asks = stream(plan.seed + 1000 * round_ + 500, first_index=round_ * 16 * INDEX_BLOCK)
            say(f"{out.system}: measuring capacity: {plan.capacity_concurrency} clients in a closed loop for "
                f"{plan.capacity_duration_s:.0f} s")
            mean = mean_output_tokens(mix(plan.seed, 10_000))
            capacity = await measure(client, log, MODEL_ID, prompts, asks, plan.capacity_concurrency,
                                     plan.capacity_duration_s, mean)
            say(f"{out.system}: capacity {capacity.rate_rps:.2f} req/s ({capacity.output_tok_s:.0f} output tok/s "
                f"over {mean:.0f} tokens a request; {capacity.completed} finished in {capacity.counted_s:.0f} s)")
            await asyncio.sleep(plan.settle_s)
            if capacity.rate_rps <= 0 and fallback is not None:  # its windows still run, at another's rate
                say(f"{out.system}: its own loop got nothing back; windows at {fallback.note}")
                out.own_capacity, capacity = capacity, fallback
        out.capacity = capacity
        if capacity.rate_rps <= 0:
            raise RuntimeError(f"no request completed while measuring capacity ({capacity.not_ok} ended otherwise)")
        for step, multiple in enumerate(plan.multiples):
            rate = capacity.rate_rps * multiple
            window = window_for(plan, round_, step, rate)
            say(f"{out.system}: {multiple:g}x = {rate:.2f} req/s for {plan.duration_s:.0f} s "
                f"({len(window.asks)} requests), drain up to {plan.drain_s:.0f} s")
            sampler.reset_peak()
            records = await open_loop(client, log, MODEL_ID, prompts, window)
            sampler.sample()
            out.windows.append(WindowRun(multiple, rate, plan.duration_s, records, sampler.peak))
            counts = Counter(r.outcome for r in records)
            say(f"{out.system}: {multiple:g}x: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    finally:
        await client.close()


def run_launch(v: Variant, plan: Plan, round_: int, prompts: PromptMaker, capacity: Rate | None,
               fallback: Rate | None = None) -> LaunchRun:
    def windows(server: Server, out: LaunchRun) -> None:
        try:
            asyncio.run(_drive(plan, server.base_url, prompts, round_, capacity, server.sampler, out, fallback))
        except RuntimeError as err:
            out.status = f"failed: {err}"
            return
        if not server.running():
            out.status = f"exited with status {server.group.proc.returncode} during the run"

    return launch(v, plan.at, plan.at.work / f"{v.system}.r{round_}.server.log", round_, LaunchRun, windows,
                  startup_timeout_s=plan.startup_timeout_s, stop_grace_s=plan.stop_grace_s, say=say)

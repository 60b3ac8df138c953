"""`python -m loadkit prefill-share`: how a long prompt and the running streams share the engine, per
`engine.max_num_batched_tokens` (issue 15; docs/sizing.md).

One trial: short streams decode steadily, a long prompt arrives and a short request right after it; measured: the
streams' usual gap between tokens, the longest gap while the long prompt is prefilled (the stall), and both first
tokens. Each budget is a stack of its own, in interleaved rounds. Per-chunk timing of streams beside one another is
not something `vllm bench serve` gives: they go through the kit's SDK client (loadkit.sdk), each sent once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from loadkit.record import Record
from loadkit.report import progress
from loadkit.sdk import AttemptLog, make_client, send
from loadkit.service import BASE_CONFIG, OwnService
from loadkit.stats import percentile
from loadkit.waiting import until
from loadkit.workload import Ask, PromptMaker

STEADY_TOKENS = 10  # tokens every stream has before the long prompt is sent
say = progress("prefill-share")


@dataclass
class Trial:
    budget: int | None  # max_num_batched_tokens (None: vLLM's default)
    round: int
    baseline_gap_s: float  # the streams' median gap between tokens before the long prompt arrived
    stall_s: float  # the longest gap of any running stream while the long prompt was prefilled
    long_ttft_s: float
    short_ttft_s: float  # a short request sent right after the long one


@dataclass
class Plan:
    budgets: list[int | None]
    rounds: int = 2
    trials: int = 3  # per stack
    streams: int = 8
    long_prompt_tokens: int = 1800
    stream_tokens: int = 200
    work_dir: Path = Path("/tmp")
    base_config: Path = BASE_CONFIG


class _Sender:
    """One trial's streams, each sent once (max_retries=0); a stream that fails ends the trial with its reason."""

    def __init__(self, client, log: AttemptLog, model: str, prompts: PromptMaker, index: int):
        self.client, self.log, self.model, self.prompts, self.index = client, log, model, prompts, index

    def record(self, i: int, prompt_tokens: int, max_tokens: int) -> Record:
        ask = Ask(index=self.index * 100 + i, prompt_tokens=prompt_tokens, max_tokens=max_tokens, stream=True)
        return Record(time.monotonic(), ask=ask, chunk_times=[])

    async def send(self, rec: Record) -> Record:
        await send(self.client, self.log, self.model, self.prompts, rec)
        if rec.outcome != "ok":
            raise RuntimeError(f"a stream ended {rec.outcome}: {rec.status or ''} {rec.detail}")
        return rec

    async def first_token(self, i: int, prompt_tokens: int) -> float:
        return (await self.send(self.record(i, prompt_tokens, 2))).ttft


async def trial(base_url: str, plan: Plan, prompts: PromptMaker, model: str, index: int) -> tuple[float, ...]:
    """(baseline gap, stall, long first token, short first token) of one trial."""
    client, log = make_client(base_url, 300, max_retries=0)
    try:
        sender = _Sender(client, log, model, prompts, index)
        running = [sender.record(i, 60, plan.stream_tokens) for i in range(plan.streams)]
        streams = [asyncio.create_task(sender.send(rec)) for rec in running]

        def steady() -> bool:  # a stream that ended early raised: say why
            for task in streams:
                if task.done():
                    task.result()
            return min(len(rec.chunk_times) for rec in running) >= STEADY_TOKENS

        # The long prompt arrives once every stream decodes steadily (a few tokens each).
        with contextlib.suppress(TimeoutError):
            await until(steady, 120, interval_s=0.05)
        t_long = time.monotonic()
        long_task = asyncio.create_task(sender.first_token(90, plan.long_prompt_tokens))
        await asyncio.sleep(0.1)  # the short request arrives just after the long one, not with it
        short_ttft = await sender.first_token(91, 60)
        long_ttft = await long_task
        await asyncio.gather(*streams)
    finally:
        await client.close()
    t_done = t_long + long_ttft
    before, during = [], []
    for rec in running:
        times = rec.chunk_times
        gaps = list(zip(times, times[1:], strict=False))
        before += [b - a for a, b in gaps if b < t_long]
        during += [b - a for a, b in gaps if b > t_long and a < t_done]
    return _median(before), max(during, default=float("nan")), long_ttft, short_ttft


def _median(values: list[float]) -> float:
    v = percentile(values, 50)
    return float("nan") if v is None else v


def run_stack(plan: Plan, budget: int | None, round_: int) -> list[Trial]:
    service = OwnService(plan.base_config, f"prefill-share-{budget or 'default'}-{round_}", work_dir=plan.work_dir,
                         key=False, engine={"max_num_batched_tokens": budget} if budget is not None else None,
                         deployment={"ttft_target_s": None})  # the engine's own sharing, not admission, is measured
    out = []
    try:
        why = service.start(600, ready_model=service.model)
        if why is not None:
            raise RuntimeError(f"the stack with max_num_batched_tokens={budget} did not start: {why}")

        async def go() -> None:
            async with httpx.AsyncClient(base_url=service.base_url, timeout=60) as http:
                model = (await http.get("/v1/models")).json()["data"][0]["id"]
                prompts = PromptMaker()
                await prompts.calibrate(http, model)
            await trial(service.base_url, plan, prompts, model, 0)  # warm-up, not counted
            for i in range(plan.trials):
                figures = await trial(service.base_url, plan, prompts, model, i + 1)
                out.append(Trial(budget, round_, *figures))
                say(f"max_num_batched_tokens={budget or 'default'} round {round_} trial {i}: baseline gap "
                    f"{figures[0] * 1000:.0f} ms, stall {figures[1] * 1000:.0f} ms, long first token "
                    f"{figures[2]:.2f} s, short first token {figures[3]:.2f} s")

        asyncio.run(go())
    finally:
        report = service.stop(sigint_wait_s=120, sigterm_wait_s=15, sigkill_wait_s=15, leftover_wait_s=10)
        say(f"stack stopped: {report.text() if report else 'never started'}")
    return out


def run(plan: Plan) -> list[Trial]:
    trials = []
    for round_ in range(plan.rounds):
        order = plan.budgets if round_ % 2 == 0 else list(reversed(plan.budgets))
        for budget in order:
            trials += run_stack(plan, budget, round_)
    return trials


def table(trials: list[Trial]) -> list[str]:
    """Markdown: per budget, the medians over its trials (and the worst stall)."""
    lines = ["| max_num_batched_tokens | Trials | Streams' usual gap (ms) | Stall, median / worst (ms) | "
             "Long prompt's first token (s) | Short request's first token (s) |", "|---|---:|---:|---:|---:|---:|"]
    for budget in dict.fromkeys(t.budget for t in trials):
        ts = [t for t in trials if t.budget == budget]
        gap, stall = _median([t.baseline_gap_s for t in ts]), _median([t.stall_s for t in ts])
        lines.append(f"| {budget or 'default (2048)'} | {len(ts)} | {gap * 1000:.0f} "
                     f"| {stall * 1000:.0f} / {max(t.stall_s for t in ts) * 1000:.0f} "
                     f"| {_median([t.long_ttft_s for t in ts]):.2f} | {_median([t.short_ttft_s for t in ts]):.2f} |")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m loadkit prefill-share", description=__doc__.split("\n\n")[0],
                                epilog="On a shared machine wrap it: flock /tmp/realstack.lock .venv/bin/python -m "
                                "loadkit prefill-share ...")
    p.add_argument("--budgets", default="256,512,1024,default",
                   help="comma-separated max_num_batched_tokens values; 'default' is vLLM's own")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trials", type=int, default=3, help="trials per stack, after one warm-up (default 3)")
    p.add_argument("--long-prompt", type=int, default=1800, help="the long prompt's tokens (default 1800)")
    args = p.parse_args(argv)
    budgets = [None if b.strip() == "default" else int(b) for b in args.budgets.split(",")]
    with tempfile.TemporaryDirectory(prefix="prefill-share-") as work:
        trials = run(Plan(budgets=budgets, rounds=args.rounds, trials=args.trials,
                          long_prompt_tokens=args.long_prompt, work_dir=Path(work)))
    print("\n".join(table(trials)))
    return 0

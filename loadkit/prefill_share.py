"""How a long prompt and the running streams share the engine, per `engine.max_num_batched_tokens` (issue 15).

vLLM prefills a prompt in chunks of at most `max_num_batched_tokens` tokens a step, decodes of the running streams
riding along in the same steps. A large budget prefills a long prompt in few steps, each of which holds every
running stream's next token back for its whole length; a small one spreads it over many short steps. One trial:
`streams` short streams decode steadily; a long prompt (most of the context window) arrives, and a short request
right after it; measured: the longest gap between two tokens of any running stream while the long prompt is
prefilled (the stall it causes), the streams' usual gap before it, the long prompt's first token and the short
request's. Each budget is a stack of its own (`python -m app serve`, configs/cpu.yaml otherwise), started and
stopped in interleaved rounds so that the machine's drift falls on each alike.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import yaml

from loadkit.bench.launch import wait_ready
from loadkit.goodput.workload import Ask
from loadkit.overload.mix import PromptMaker
from loadkit.service import ProcessGroup, child_env, free_port
from loadkit.stats import percentile

STEADY_TOKENS = 10  # tokens every stream has before the long prompt is sent


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
    repo: Path
    budgets: list[int | None]
    rounds: int = 2
    trials: int = 3  # per stack
    streams: int = 8
    long_prompt_tokens: int = 1800
    stream_tokens: int = 200
    work_dir: Path = Path("/tmp")


def say(message: str) -> None:
    print(f"[prefill-share {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _config(repo: Path, port: int, budget: int | None) -> dict:
    config = yaml.safe_load((repo / "configs" / "cpu.yaml").read_text())
    config["service"]["port"] = port
    model = config["models"][0]
    if budget is not None:
        model["engine"]["max_num_batched_tokens"] = budget
    model["deployment"]["ttft_target_s"] = None  # the engine's own sharing, not admission, is measured here
    return config


async def _stream(client: openai.AsyncOpenAI, model: str, messages: list, max_tokens: int,
                  times: list[float]) -> list[float]:
    """Appends the time of every content chunk of one greedy stream of exactly `max_tokens` tokens to `times`."""
    stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                  temperature=0, stream=True, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.monotonic())
    return times


async def _first_token(client: openai.AsyncOpenAI, model: str, messages: list) -> float:
    t0 = time.monotonic()
    times = await _stream(client, model, messages, 2, [])
    return times[0] - t0


async def trial(base_url: str, plan: Plan, prompts: PromptMaker, model: str, index: int) -> tuple[float, ...]:
    """(baseline gap, stall, long first token, short first token) of one trial."""
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=300) as client:
        def messages(i: int, tokens: int) -> list:
            return prompts.messages(Ask(index=index * 100 + i, prompt_tokens=tokens, max_tokens=1, stream=True))

        chunk_times: list[list[float]] = [[] for _ in range(plan.streams)]
        streams = [asyncio.create_task(_stream(client, model, messages(i, 60), plan.stream_tokens, chunk_times[i]))
                   for i in range(plan.streams)]
        # The long prompt arrives once every stream decodes steadily (a few tokens each).
        deadline = time.monotonic() + 120
        while min(len(t) for t in chunk_times) < STEADY_TOKENS and time.monotonic() < deadline:
            if any(t.done() for t in streams):
                await asyncio.gather(*streams)  # a stream that ended early raised: say why
            await asyncio.sleep(0.05)
        t_long = time.monotonic()
        long_task = asyncio.create_task(_first_token(client, model, messages(90, plan.long_prompt_tokens)))
        await asyncio.sleep(0.1)  # the short request arrives just after the long one, not with it
        short_ttft = await _first_token(client, model, messages(91, 60))
        long_ttft = await long_task
        await asyncio.gather(*streams)
    t_done = t_long + long_ttft
    before, during = [], []
    for times in chunk_times:
        gaps = list(zip(times, times[1:], strict=False))
        before += [b - a for a, b in gaps if b < t_long]
        during += [b - a for a, b in gaps if b > t_long and a < t_done]
    return _median(before), max(during, default=float("nan")), long_ttft, short_ttft


def _median(values: list[float]) -> float:
    v = percentile(values, 50)
    return float("nan") if v is None else v


def run_stack(plan: Plan, budget: int | None, round_: int) -> list[Trial]:
    port = free_port()
    path = plan.work_dir / f"prefill-share-{budget or 'default'}-{round_}.yaml"
    path.write_text(yaml.safe_dump(_config(plan.repo, port, budget)))
    group = ProcessGroup([sys.executable, "-m", "app", "serve", "--config", str(path)], cwd=plan.repo,
                         env=child_env(), log_path=path.with_suffix(".log"))
    base = f"http://127.0.0.1:{port}"
    out = []
    try:
        why = wait_ready(group, port, timeout_s=600)
        if why is not None:
            raise RuntimeError(f"the stack with max_num_batched_tokens={budget} did not start: {why}")

        async def go() -> None:
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                model = (await http.get("/v1/models")).json()["data"][0]["id"]
                prompts = PromptMaker()
                await prompts.calibrate(http, model)
            await trial(base, plan, prompts, model, 0)  # warm-up, not counted
            for i in range(plan.trials):
                figures = await trial(base, plan, prompts, model, i + 1)
                out.append(Trial(budget, round_, *figures))
                say(f"max_num_batched_tokens={budget or 'default'} round {round_} trial {i}: baseline gap "
                    f"{figures[0] * 1000:.0f} ms, stall {figures[1] * 1000:.0f} ms, long first token "
                    f"{figures[2]:.2f} s, short first token {figures[3]:.2f} s")

        asyncio.run(go())
    finally:
        report = group.stop(sigint_wait_s=120, sigterm_wait_s=15, sigkill_wait_s=15)
        say(f"stack stopped: {report.text()}")
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

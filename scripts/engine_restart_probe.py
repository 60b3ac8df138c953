"""The real engine, in this process (no Ray): an `EngineHost` over vLLM with an `engine_factory`, and what its
in-place restart costs. Prints, as it goes and as one JSON line at the end:

- `busy`: 32 concurrent prompts at the model's full context; the longest the engine went with no output
  (as the host saw it), the wedge bound that applied, and whether it tripped (it must not);
- `sigkill`: SIGKILL of the EngineCore under a stream: seconds until the stream ended, until the engine was
  restarted, and until the next successful generation;
- `sigstop`: SIGSTOP of the EngineCore under a stream: seconds until the wedge was declared, until the stream
  ended, until the restart was done, and until the next successful generation.

    flock /tmp/realstack.lock .venv/bin/python scripts/engine_restart_probe.py [--config configs/cpu.yaml]
        [--skip-busy] [--floor-s 30] [--competing-load]

`--competing-load`: once the prefill rate is measured at idle, one busy process per CPU competes with the
engine for the rest of the run (a CPU shared with other work): the engine is slower than any rate it measured,
and must still never be declared wedged while it progresses (issue 27).

It starts one vLLM engine at a time (about 25 s each here, three starts in all) and leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli.reaper import kill_descendants  # noqa: E402
from app.config.app_config import load_config  # noqa: E402
from app.engine.interface import Admitted, GenerateRequest, GenerationParams, PromptInput  # noqa: E402
from app.errors import ServiceError  # noqa: E402
from app.host.engine_host import EngineHost  # noqa: E402
from app.host.progress_watch import ProgressWatch  # noqa: E402

_count = 0


def say(*parts: object) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def request(text: str, max_tokens: int, timeout_s: float = 300.0) -> GenerateRequest:
    global _count
    _count += 1
    return GenerateRequest(
        request_id=f"probe-{_count}",
        prompt=PromptInput(text=text),
        params=GenerationParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        timeout_s=timeout_s,
    )


def engine_cores() -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "EngineCore" in p.name() + " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


async def generate_once(host: EngineHost, text: str = "The capital of France is", max_tokens: int = 4) -> int:
    tokens = 0
    async for item in host.generate(request(text, max_tokens)):
        if not isinstance(item, Admitted):
            tokens += sum(c.num_tokens for c in item.choices)
    return tokens


async def until_served(host: EngineHost, since: float, limit_s: float = 600.0) -> float:
    """Seconds from `since` to the first generation that succeeds, trying every 0.2 s."""
    while time.monotonic() - since < limit_s:
        try:
            if await generate_once(host) > 0:
                return time.monotonic() - since
        except ServiceError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError("no successful generation")


async def stream_until_error(host: EngineHost, started: asyncio.Event) -> float | None:
    """A long stream; returns time.monotonic() when it ended with an error (None if it finished)."""
    try:
        async for item in host.generate(request("Tell me a long story about a lighthouse.", 1000)):
            if not isinstance(item, Admitted):
                started.set()
    except ServiceError as err:
        say("stream ended:", err.status, err.message[:160], "retry-after", err.retry_after_s)
        return time.monotonic()
    return None


async def busy(host: EngineHost, tokenizer_text: str) -> dict[str, object]:
    """32 prompts at the full context at once; the longest quiet as the host's watch saw it."""
    n_ctx = host.model.engine.max_model_len
    max_tokens = 16
    ids = host.engine.encode(tokenizer_text)
    prompt_ids = (ids * (n_ctx // max(1, len(ids)) + 1))[: n_ctx - max_tokens - 1]
    text = host.engine.decode(prompt_ids)
    while len(host.engine.encode(text)) > n_ctx - max_tokens - 16:  # room for each request's own opening
        text = text[:-20]
    last_output = [time.monotonic()]
    longest_quiet = [0.0]
    firsts: list[float] = []  # each request's first output, seconds from the start
    bounds: list[float] = []

    async def one(i: int) -> int:
        tokens = 0
        # Each prompt opens differently: the prefix cache (blocks hashed from the first) cannot share their prefill.
        async for item in host.generate(request(f"Request number {i}. {text}", max_tokens)):
            if not isinstance(item, Admitted):
                now = time.monotonic()
                if not tokens:
                    firsts.append(now - started)
                longest_quiet[0] = max(longest_quiet[0], now - last_output[0])
                last_output[0] = now
                tokens += sum(c.num_tokens for c in item.choices)
        return tokens

    async def sample_bound() -> None:
        while True:
            await asyncio.sleep(0.5)
            bounds.append(host.supervisor.watch.bound_s(host._prefill_tokens_per_s()))

    sampler = asyncio.create_task(sample_bound())
    started = time.monotonic()
    last_output[0] = started
    tokens = await asyncio.gather(*(one(i) for i in range(32)))
    sampler.cancel()
    stats = await host.stats()
    return {
        "prompt_tokens_each": len(host.engine.encode(text)),
        "requests": 32,
        "seconds": round(time.monotonic() - started, 1),
        "all_tokens": sum(tokens) == 32 * max_tokens,
        "longest_quiet_s": round(longest_quiet[0], 2),
        "first_output_s": [round(min(firsts), 1), round(max(firsts), 1)] if firsts else None,
        "smallest_bound_s": round(min(bounds), 1) if bounds else None,
        "wedged": host.supervisor.wedged_total,
        "prefill_tokens_per_s": stats.pace.prefill_tokens_per_s,
    }


async def fault(host: EngineHost, sig: signal.Signals) -> dict[str, object]:
    restarts, wedged = host.supervisor.restarts_total, host.supervisor.wedged_total
    started = asyncio.Event()
    stream = asyncio.create_task(stream_until_error(host, started))
    await asyncio.wait_for(started.wait(), 120)
    cores = engine_cores()
    say(f"sending {sig.name} to EngineCore {[p.pid for p in cores]}")
    sent = time.monotonic()
    for p in cores:
        os.kill(p.pid, sig)
    detected = None
    while host.supervisor.restarts_total == restarts:
        if host.supervisor.failure or time.monotonic() - sent > 600:
            raise RuntimeError(f"no restart: {host.supervisor.failure or 'not done in 600 s'}")
        if detected is None and host.supervisor.wedged_total > wedged:
            detected = time.monotonic() - sent
        await asyncio.sleep(0.05)
    restarted = time.monotonic() - sent
    ended = await stream
    served = await until_served(host, sent)
    leftovers = [p.pid for p in cores if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    result = {
        "stream_ended_s": round(ended - sent, 2) if ended else None,
        "restart_done_s": round(restarted, 1),
        "next_success_s": round(served, 1),
        "old_engine_processes_left": leftovers,
    }
    if sig == signal.SIGSTOP:
        result["wedge_declared_s"] = round(detected, 1) if detected is not None else None
    return result


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    from app.engine.vllm.engine import VLLMEngine

    config = load_config(args.config)
    # No latency targets and a long queue timeout: the busy phase measures the engine with 32 full prompts in
    # flight or queued (the KV cache may hold fewer), which admission by time would refuse in part.
    deployment = config.models[0].deployment.model_copy(
        update={"ttft_target_s": None, "request_target_s": None, "queue_timeout_s": 600}
    )
    model = config.models[0].model_copy(update={"deployment": deployment})
    built = time.monotonic()
    host = EngineHost(
        model,
        VLLMEngine(model),
        config.service,
        engine_factory=lambda: VLLMEngine(model),
        progress_watch=ProgressWatch(floor_s=args.floor_s),
    )
    say(f"engine up in {time.monotonic() - built:.1f} s")
    results: dict[str, object] = {"config": args.config, "floor_s": args.floor_s}
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        sample = "The quick brown fox jumps over the lazy dog near the riverbank at dawn. "
        for words in (8, 64, 256, 512, 900):  # one at a time, so the pace measures the prefill rate
            await generate_once(host, sample * (words // 14 + 1), max_tokens=4)
        results["prefill_tokens_per_s_measured"] = (await host.stats()).pace.prefill_tokens_per_s
        say("prefill rate measured:", results["prefill_tokens_per_s_measured"])
        if args.competing_load:
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
            results["competing_processes"] = len(hogs)
            say(f"{len(hogs)} busy process(es) now compete with the engine")
        if not args.skip_busy:
            results["busy"] = await busy(host, sample)
            say("busy:", results["busy"])
        results["sigkill"] = await fault(host, signal.SIGKILL)
        say("sigkill:", results["sigkill"])
        results["sigstop"] = await fault(host, signal.SIGSTOP)
        say("sigstop:", results["sigstop"])
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        await asyncio.to_thread(host.shutdown)
        results["wedged_total"] = host.supervisor.wedged_total
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/cpu.yaml")
    parser.add_argument("--floor-s", type=float, default=30.0)
    parser.add_argument("--skip-busy", action="store_true")
    parser.add_argument("--competing-load", action="store_true")
    args = parser.parse_args()
    try:
        results = asyncio.run(main_async(args))
    finally:
        left = kill_descendants(grace_s=5.0)
        if left:
            say(f"killed {left} leftover process(es)")
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

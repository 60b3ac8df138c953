"""Two checkouts of this project side by side: in each round, each checkout's `python -m app serve` (the default
config on a free port, started as loadkit's `OwnService` starts it, from the checkout's own code) is timed until
/health answers, driven with 1, 16 and 32 greedy streams of 128 tokens through the `openai` SDK, and stopped
leaving nothing behind. Prints one row per checkout and round: seconds to /health, the model's own "ready in",
output tokens/s and first-token p50 per concurrency (docs/autoscaling.md, "Not yet").

    .venv/bin/python scripts/start_and_streams.py --checkouts /path/before,/path/after [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path

from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadkit.service import OwnService  # noqa: E402

MODEL = "smollm2-135m-instruct"


async def _stream(client: AsyncOpenAI, i: int) -> tuple[int, float]:
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Write a long story about ships, number {i}."}],
        max_tokens=128, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and not first:
            first = time.perf_counter() - started
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return tokens, first


async def _load(base_url: str) -> str:
    cells = []
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="unused") as client:
        await _stream(client, -1)  # warm
        for n in (1, 16, 32):
            started = time.perf_counter()
            done = await asyncio.gather(*(_stream(client, i) for i in range(n)))
            rate = sum(t for t, _ in done) / (time.perf_counter() - started)
            cells.append(f"{rate:.1f} tok/s, first token p50 {sorted(f for _, f in done)[n // 2] * 1000:.0f} ms")
    return " | ".join(cells)


def _round(checkout: Path) -> str:
    service = OwnService(checkout / "configs" / "cpu.yaml", "start-and-streams", repo=checkout, key=False)
    started = time.perf_counter()
    try:
        if why := service.start(startup_timeout_s=600):
            raise RuntimeError(f"the service in {checkout} did not start: {why}")
        healthy = time.perf_counter() - started
        ready = re.search(r"ready in ([0-9.]+) s", service.log_text())
        load = asyncio.run(_load(service.base_url))
    finally:
        service.stop()  # Ctrl-C to its process group, whatever outlives it killed
    return f"{healthy:.1f} s | {ready.group(1) if ready else '?'} s | {load}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkouts", required=True, help="two (or more) folders, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    checkouts = [Path(p).resolve() for p in args.checkouts.split(",")]
    print("| round | checkout | /health after | model ready in | 1 stream | 16 streams | 32 streams |")
    print("|---:|---|---:|---:|---|---|---|")
    for n in range(1, args.rounds + 1):
        for checkout in checkouts:
            row = _round(checkout)
            print(f"| {n} | {checkout.name} | {row} |", flush=True)


if __name__ == "__main__":
    main()

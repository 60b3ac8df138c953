"""Two checkouts of this project side by side: in each round, each checkout's `python -m app serve` (the default
config, its own .venv) is started, timed until /health answers, driven with 1, 16 and 32 greedy streams of 128
tokens through the `openai` SDK, and stopped (its process group, leaving nothing behind). Prints one row per
checkout and round: seconds to /health, the model's own "ready in", output tokens/s and first-token p50 per
concurrency (docs/autoscaling.md, "Not yet"). Needs port 8000 free.

    .venv/bin/python scripts/start_and_streams.py --checkouts /path/before,/path/after [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI

URL = "http://127.0.0.1:8000"
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


async def _load() -> str:
    cells = []
    async with AsyncOpenAI(base_url=URL + "/v1", api_key="unused") as client:
        await _stream(client, -1)  # warm
        for n in (1, 16, 32):
            started = time.perf_counter()
            done = await asyncio.gather(*(_stream(client, i) for i in range(n)))
            rate = sum(t for t, _ in done) / (time.perf_counter() - started)
            cells.append(f"{rate:.1f} tok/s, first token p50 {sorted(f for _, f in done)[n // 2] * 1000:.0f} ms")
    return " | ".join(cells)


def _round(checkout: Path, log: Path) -> str:
    started = time.perf_counter()
    with log.open("w") as out:
        serve = subprocess.Popen([str(checkout / ".venv/bin/python"), "-m", "app", "serve"], cwd=checkout,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if serve.poll() is not None:
                raise RuntimeError(f"the service in {checkout} exited: see {log}")
            try:
                if httpx.get(URL + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)  # polling a starting service's /health
        healthy = time.perf_counter() - started
        ready = re.search(r"ready in ([0-9.]+) s", log.read_text(errors="replace"))
        load = asyncio.run(_load())
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C: the CLI stops Ray and every engine it started
        try:
            serve.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):  # whatever of its group outlived it
                os.killpg(serve.pid, signal.SIGKILL)
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
            row = _round(checkout, Path(tempfile.gettempdir()) / f"start_and_streams-{checkout.name}.log")
            print(f"| {n} | {checkout.name} | {row} |", flush=True)


if __name__ == "__main__":
    main()

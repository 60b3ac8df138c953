"""What vLLM's CPU worker process costs an engine's start: `AsyncLLM` with vLLM's default on the CPU (the
multiprocessing executor: an EngineCore process, which spawns a worker process that computes) beside the
in-process executor (`UniProcExecutor`: the EngineCore computes itself, one process fewer). Each round starts
each engine in a fresh process, in turn, and prints the seconds to import vLLM, to a ready engine, and the output
tokens/s of one and of 16 greedy streams of 128 tokens (docs/autoscaling.md, "Not yet").

vLLM's CPU platform turns the executor named "uni" into "mp" (its OpenMP binding lives in the multiprocessing
executor), so the class is passed; nothing binds the in-process engine's threads, so both run with
OMP_NUM_THREADS=1 (`--threads`) to compare like with like.

    .venv/bin/python scripts/cpu_executor_start.py [--rounds 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

PROMPT = "Tell me a long story about the sea and the ships that sail on it, number {i}. " * 8


async def _streams(engine, n: int, tag: str) -> float:  # noqa: ANN001 (vLLM's AsyncLLM, imported late)
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=128, ignore_eos=True, temperature=0, output_kind=RequestOutputKind.DELTA)

    async def one(i: int) -> int:
        tokens = 0
        async for out in engine.generate(PROMPT.format(i=i), params, request_id=f"{tag}-{n}-{i}"):
            tokens += len(out.outputs[0].token_ids)
        return tokens

    start = time.perf_counter()
    produced = await asyncio.gather(*(one(i) for i in range(n)))
    return sum(produced) / (time.perf_counter() - start)


async def _one(executor: str, started: float) -> dict[str, float | str]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    from app.engine.model_store import resolve_source

    imported = time.perf_counter() - started
    backend = {"distributed_executor_backend": UniProcExecutor} if executor == "uni" else {}
    args = AsyncEngineArgs(model=resolve_source("default"), max_model_len=2048, max_num_seqs=32, dtype="auto",
                           enforce_eager=True, kv_cache_memory_bytes=2 * 2**30, **backend)
    begun = time.perf_counter()
    engine = AsyncLLM.from_engine_args(args)
    ready = time.perf_counter() - begun
    try:
        await _streams(engine, 1, "warm")
        one_stream = await _streams(engine, 1, "one")
        sixteen = await _streams(engine, 16, "sixteen")
    finally:
        engine.shutdown()
    return {"executor": executor, "import_s": imported, "ready_s": ready, "tok_s_1": one_stream,
            "tok_s_16": sixteen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--one", choices=["mp", "uni"], help=argparse.SUPPRESS)  # a child: one engine, one line
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(_one(args.one, float(os.environ["START"])))), flush=True)
        return
    print("| round | executor | import vLLM (s) | to a ready engine (s) | 1 stream (tok/s) | 16 streams (tok/s) |")
    print("|---:|---|---:|---:|---:|---:|")
    for n in range(1, args.rounds + 1):
        for executor in ("mp", "uni"):
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "START": "", "PYTHONPATH": os.getcwd()}
            env["START"] = repr(time.perf_counter())  # the child's clock is the same monotonic clock
            child = subprocess.run([sys.executable, __file__, "--one", executor], env=env, capture_output=True,
                                   text=True, check=True)
            row = json.loads(child.stdout.strip().splitlines()[-1])
            print(f"| {n} | {executor} | {row['import_s']:.1f} | {row['ready_s']:.1f} | {row['tok_s_1']:.1f} | "
                  f"{row['tok_s_16']:.1f} |", flush=True)


if __name__ == "__main__":
    main()

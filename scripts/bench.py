#!/usr/bin/env python3
"""Benchmarks against the peers, side by side in one run.

Starts each system in turn on the default model with identical engine settings, drives it
with the same load (vLLM's own load generator, `vllm bench serve`, against the streaming chat
endpoint), stops it (leaving no process behind) and moves on. Then writes a Markdown report
and two plots. The work is done by `loadkit.bench`; this file is its command line.

Systems (--systems; by default app, vllm, ray-llm, naive, in this order; `all` adds the others):
  app          this project: `python -m app serve --config <generated from configs/cpu.yaml>`
  app-proxy    the same through Ray Serve's HTTP proxy (`--serve-proxy`), the KubeRay path
  app-ingress  the same with a separate ingress deployment (`service.colocate_ingress: false`)
  app-cluster  the KubeRay path with two replicas: benchmarks/app_cluster.py starts a local multi-node Ray
               cluster (a head and 2 worker nodes, each on its own core), `serve deploy`s the CPU manifest's own
               serveConfigV2 (configs/kuberay/rayservice-cpu.yaml; only the proxy's address, the engine settings
               below and open admission changed) and serves through Serve's proxy; the report adds the time from
               `serve deploy` to every replica running, each replica's start-up, its share of requests and
               tokens, and throughput per replica
  vllm         bare vLLM: `python -m vllm.entrypoints.openai.api_server ...`
  ray-llm      Ray Serve LLM: benchmarks/ray_serve_llm.py (ray.serve.llm.build_openai_app)
  naive        baseline: benchmarks/naive_fastapi.py (FastAPI + transformers generate, Semaphore(2))

Identical engine settings for the vLLM-based systems: enforce_eager, max_model_len 2048,
max_num_seqs 64, KV cache 2 GiB (VLLM_CPU_KVCACHE_SPACE=2 / kv_cache_gib 2), one engine replica.

Precision (--dtype, a comma-separated list of auto, bfloat16, float16, float32; default: the one
of configs/cpu.yaml): every vLLM-based system runs at each precision, side by side in the same
rounds, and the report labels each with it. `auto` is this project with `engine.dtype: auto` and
vLLM's own `--dtype auto` for bare vLLM and Ray Serve LLM. The naive baseline runs once, at the
first precision. The report records the CPU model, its flags (avx2, avx512f, avx512_bf16, amx...),
the core count and the precisions.

Load, the same for every system: backend openai-chat, endpoint /v1/chat/completions
(streaming), random dataset with a fixed seed, fixed input length, fixed output length
with ignore_eos, greedy (temperature 0), for each --max-concurrency in the sweep with
num-prompts scaled to concurrency. The run goes in --repeats rounds: in round i every system is
started, swept once with seed i (the same prompts for every system in a round, new ones each
round, so no prefix cache carries over) and stopped; the machine's speed drifts over minutes,
and in rounds that drift falls on every system alike. The figures pool every request of the
rounds; one run's spread on a shared machine, a few percent, would otherwise decide a 0.95x
target. Peak memory is the peak of the summed RSS of the
system's whole process tree (children included), sampled while the load runs.

    .venv/bin/python scripts/bench.py                       # the full sweep (make bench)
    .venv/bin/python scripts/bench.py --systems app,vllm --concurrency 1,4
    .venv/bin/python scripts/bench.py --systems app,vllm --dtype bfloat16,float32,auto
    .venv/bin/python scripts/bench.py --systems app,app-proxy,app-cluster,vllm --concurrency 16,64 --repeats 1
    .venv/bin/python scripts/bench.py --quick               # naive baseline, a handful of requests
    .venv/bin/python scripts/bench.py --report-only bench-results/<timestamp>   # redo report + plots only

Outputs: <out-dir>/benchmarks.md, <out-dir>/bench_throughput.png, <out-dir>/bench_ttft.png
(out-dir defaults to docs/); raw results (per-run JSON from the load generator, server and
load-generator logs, the generated config, results.json) under --work-dir (default
bench-results/<timestamp>/, git-ignored).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kit, also before `pip install -e .` knows it

from loadkit.bench.load import DEFAULT_INPUT_LEN, DEFAULT_REPEATS, FULL_SWEEP  # noqa: E402
from loadkit.bench.run import Options, report_only, run  # noqa: E402
from loadkit.bench.systems import DEFAULT_SYSTEMS, SYSTEMS, config_dtype  # noqa: E402
from loadkit.precision import DTYPES, parse_dtypes  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=None, help=f"comma-separated subset of {','.join(SYSTEMS)}, or `all` "
                   f"(default: {','.join(DEFAULT_SYSTEMS)}; with --quick: naive)")
    p.add_argument("--dtype", default=None,
                   help=f"comma-separated precisions, of {', '.join(DTYPES)}: every vLLM-based system runs at each "
                   "(default: configs/cpu.yaml's engine.dtype)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"rounds: every system swept this many times, interleaved, pooled (default {DEFAULT_REPEATS}; "
                   "the naive baseline 1; --quick: 1)")
    p.add_argument("--concurrency", default=None,
                   help="comma-separated --max-concurrency sweep (default 1,4,16,64; with --quick: 2)")
    p.add_argument("--quick", action="store_true",
                   help="one system, one concurrency, a handful of short requests (a smoke run)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="prompts per run (default max(8, 4 x concurrency); --quick: 4)")
    p.add_argument("--input-len", type=int, default=None,
                   help=f"prompt tokens (default {DEFAULT_INPUT_LEN}; --quick: 32)")
    p.add_argument("--output-len", type=int, default=None,
                   help="output tokens (default 64 at concurrency 1, else 128; --quick: 16)")
    p.add_argument("--warmups", type=int, default=None,
                   help="warm-up requests before each run (default: as many as the concurrency, at least 2; "
                   "naive: 2; --quick: 1)")
    p.add_argument("--out-dir", type=Path, default=REPO / "docs",
                   help="where benchmarks.md and the plots go (default docs/)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="raw results and logs (default bench-results/<timestamp>/)")
    p.add_argument("--model-dir", default=None, help="model folder (default: `python -m app prepare-model`)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds each system may take to become ready")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="seconds one load run may take (default: scaled to its size)")
    p.add_argument("--stop-grace", type=float, default=60.0, help="seconds after SIGINT before SIGTERM/SIGKILL")
    p.add_argument("--ray-stream-batching-ms", type=float, default=None,
                   help="Ray Serve LLM's stream_batching_interval_ms (default: its own, 50 ms; 0 sends every token "
                   "at once)")
    p.add_argument("--report-only", type=Path, default=None, metavar="WORK_DIR",
                   help="start nothing: rewrite the report and plots from WORK_DIR/results.json of an earlier run")
    p.add_argument("--note", default="", help="a line for the top of the report")
    return p


def options(argv: list[str] | None) -> Options | argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.report_only:
        return args
    names = ",".join(SYSTEMS) if args.systems == "all" else args.systems
    systems = [s.strip() for s in names.split(",") if s.strip()] if names else (
        ["naive"] if args.quick else list(DEFAULT_SYSTEMS))
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        p.error(f"unknown system(s) {', '.join(bad)}; choose from {', '.join(SYSTEMS)}")
    try:
        dtypes = parse_dtypes(args.dtype) if args.dtype else [config_dtype(REPO)]
    except ValueError as err:
        p.error(str(err))
    conc = args.concurrency or ("2" if args.quick else ",".join(map(str, FULL_SWEEP)))
    concurrency = [int(c) for c in conc.split(",") if c.strip()]
    if args.quick:
        systems, concurrency = systems[:1], concurrency[:1]
        args.num_prompts = args.num_prompts or 4
        args.input_len = args.input_len or 32
        args.output_len = args.output_len or 16
        args.warmups = 1 if args.warmups is None else args.warmups
        args.repeats = args.repeats or 1
    if not concurrency or any(c < 1 for c in concurrency):
        p.error("--concurrency needs positive integers")
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats needs a positive integer")
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(
        [sys.executable, "scripts/bench.py", *argv])
    return Options(
        repo=REPO, systems=systems, dtypes=dtypes, dtypes_asked=bool(args.dtype), config_dtype=config_dtype(REPO),
        concurrency=concurrency, repeats=args.repeats, quick=args.quick, num_prompts=args.num_prompts,
        input_len=args.input_len or DEFAULT_INPUT_LEN, output_len=args.output_len, warmups=args.warmups,
        out_dir=args.out_dir, work_dir=args.work_dir, model_dir=args.model_dir, startup_timeout=args.startup_timeout,
        run_timeout=args.run_timeout, stop_grace=args.stop_grace, ray_stream_batching_ms=args.ray_stream_batching_ms,
        note=args.note, command=command)


def main(argv: list[str] | None = None) -> int:
    o = options(argv)
    if isinstance(o, argparse.Namespace):
        return report_only(o.report_only.resolve(), o.out_dir.resolve(), REPO)
    return run(o)


if __name__ == "__main__":
    sys.exit(main())

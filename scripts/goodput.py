#!/usr/bin/env python3
"""Goodput under overload, side by side: this project, bare vLLM and Ray Serve LLM, open loop.

For each system in turn (interleaved rounds, identical engine settings, the bench's start-up code): start it,
measure the rate it can serve (a closed loop at the engine's batch size; or --capacity), then send the same
seeded mix of chat requests (prompts ~40-430 tokens, outputs 16-256, streaming and not) at 1x, 2x, 4x and 8x
that rate, arriving on a seeded Poisson (or uniform) schedule whatever the answers, through the real `openai`
SDK with its default retry policy; stop it, leaving no process behind. Reports per system and rate: goodput
(requests/s and output tokens/s within the first-token and whole-request targets), latency p50/p99, refusal
latency, wasted wait, attempts per served request and peak RSS, to docs/goodput.md and docs/goodput.png. The
work is done by `loadkit.goodput`; this file is its command line.

    .venv/bin/python scripts/goodput.py                              # make goodput: all three, 1x-8x
    .venv/bin/python scripts/goodput.py --systems app --multiples 1,2 --duration 30   # a smoke run
    .venv/bin/python scripts/goodput.py --report-only bench-results/goodput-<timestamp>

On a shared machine wrap real runs: flock /tmp/realstack.lock .venv/bin/python scripts/goodput.py ...
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kit, also before `pip install -e .` knows it

from loadkit.bench.systems import SYSTEMS  # noqa: E402
from loadkit.goodput.figures import Targets  # noqa: E402
from loadkit.goodput.run import DEFAULT_MULTIPLES, DEFAULT_SYSTEMS, Options, report_only, run  # noqa: E402
from loadkit.goodput.schedule import KINDS  # noqa: E402

DEFAULTS = {"systems": ",".join(DEFAULT_SYSTEMS), "multiples": ",".join(f"{m:g}" for m in DEFAULT_MULTIPLES),
            "duration": 60.0, "rounds": 2, "capacity": None, "capacity_duration": 45.0, "arrivals": "poisson",
            "seed": 15, "ttft_target": 10.0, "total_target": 60.0}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--systems", default=d["systems"], help=f"comma-separated, of {', '.join(SYSTEMS)} "
                   f"(default {d['systems']})")
    p.add_argument("--multiples", default=d["multiples"], help=f"offered rates as multiples of each system's "
                   f"capacity (default {d['multiples']})")
    p.add_argument("--duration", type=float, default=d["duration"], help="seconds of arrivals per rate (default 60)")
    p.add_argument("--drain", type=float, default=None, help="seconds after the last arrival before what still "
                   "runs is cut off (default: the whole-request target)")
    p.add_argument("--rounds", type=int, default=d["rounds"], help="rounds, systems interleaved (default 2)")
    p.add_argument("--capacity", type=float, default=d["capacity"], help="req/s to take as every system's capacity "
                   "instead of measuring it")
    p.add_argument("--capacity-duration", type=float, default=d["capacity_duration"],
                   help="seconds of the closed loop that measures capacity (default 45)")
    p.add_argument("--capacity-concurrency", type=int, default=None,
                   help="clients of that closed loop (default: the engine's max_num_seqs)")
    p.add_argument("--arrivals", choices=KINDS, default=d["arrivals"], help="arrival schedule (default poisson)")
    p.add_argument("--seed", type=int, default=d["seed"], help="seed of the mix and the schedule (default 15)")
    p.add_argument("--ttft-target", type=float, default=d["ttft_target"], help="first-token target, s (default 10)")
    p.add_argument("--total-target", type=float, default=d["total_target"],
                   help="whole-request target, s (default 60)")
    p.add_argument("--client-timeout", type=float, default=None,
                   help="the SDK's timeout per attempt, s (default: the whole-request target)")
    p.add_argument("--dtype", default=None,
                   help="engine dtype for every system (default: configs/cpu.yaml's; `auto` is resolved as this "
                   "project resolves it, bfloat16 where the CPU computes it natively, else float32, and that one "
                   "precision is given to every system)")
    p.add_argument("--out-dir", type=Path, default=REPO / "docs", help="where goodput.md and goodput.png go")
    p.add_argument("--work-dir", type=Path, default=None, help="raw results and logs "
                   "(default bench-results/goodput-<timestamp>/)")
    p.add_argument("--model-dir", default=None, help="model folder (default: `python -m app prepare-model`)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds each system may take to start")
    p.add_argument("--stop-grace", type=float, default=60.0, help="seconds after SIGINT before SIGTERM/SIGKILL")
    p.add_argument("--note", default="", help="a line for the top of the report")
    p.add_argument("--report-only", type=Path, default=None, metavar="WORK_DIR",
                   help="start nothing: rewrite the report and plot from WORK_DIR/results.json")
    return p


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def options(argv: list[str] | None) -> Options | argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.report_only:
        return a
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS or s == "naive"]
    if bad or not systems:
        p.error(f"systems: {', '.join(bad) or 'none'}; choose vLLM-based ones of {', '.join(SYSTEMS[:-1])}")
    multiples = floats(a.multiples)
    if not multiples or any(m <= 0 for m in multiples):
        p.error("--multiples needs positive numbers")
    if a.rounds < 1 or a.duration <= 0:
        p.error("--rounds and --duration must be positive")
    targets = Targets(ttft_s=a.ttft_target, total_s=a.total_target)
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(
        [sys.executable, "scripts/goodput.py", *argv])
    defaults = all(getattr(a, k) == v for k, v in DEFAULTS.items()) and a.drain is None and a.client_timeout is None
    return Options(
        repo=REPO, command=command, systems=systems, multiples=multiples, duration_s=a.duration,
        drain_s=a.total_target if a.drain is None else a.drain, arrivals=a.arrivals, seed=a.seed, targets=targets,
        client_timeout_s=a.client_timeout or a.total_target, capacity=a.capacity,
        capacity_concurrency=a.capacity_concurrency, capacity_duration_s=a.capacity_duration, rounds=a.rounds,
        dtype=a.dtype, out_dir=a.out_dir, work_dir=a.work_dir, model_dir=a.model_dir,
        startup_timeout_s=a.startup_timeout, stop_grace_s=a.stop_grace, note=a.note, defaults=defaults)


def main(argv: list[str] | None = None) -> int:
    o = options(argv)
    if isinstance(o, argparse.Namespace):
        return report_only(o.report_only.resolve(), o.out_dir)
    return run(o)


if __name__ == "__main__":
    sys.exit(main())

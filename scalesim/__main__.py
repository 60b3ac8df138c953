"""`python -m scalesim` (`make autoscaling`): every policy on every trace, workload, fleet size and replica start
delay; the tables and the plot of docs/autoscaling.md's "Simulation" section.

    python -m scalesim [--output docs/autoscaling-simulation.md] [--plot docs/autoscaling.png] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scalesim.contenders import Bounds, contenders
from scalesim.replica import CostModel
from scalesim.report import markdown, plot
from scalesim.run import Figures, base_rps, simulate
from scalesim.traces import TRACES, WORKLOADS, arrivals

BASES = (0.5, 2.0, 4.0)  # the base load in replicas' worth: the 4x peak needs 2, 8 and 16 replicas
DELAYS = (0.0, 30.0, 60.0)  # seconds from a replica's start to its serving (the CPU's measured 25-40 s in between)
SEED = 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalesim", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("docs/autoscaling-simulation.md"))
    parser.add_argument("--plot", type=Path, default=Path("docs/autoscaling.png"))
    parser.add_argument("--quick", action="store_true", help="one fleet size and start delay (a smoke run)")
    args = parser.parse_args(argv)
    cost, bounds = CostModel(), Bounds()
    bases, delays = ((0.5,), (30.0,)) if args.quick else (BASES, DELAYS)
    started, runs = time.monotonic(), []
    for workload in WORKLOADS.values():
        for trace, shape in TRACES.items():
            for base in bases:
                jobs = arrivals(shape, base_rps(base, cost, workload), workload, SEED)
                for delay in delays if trace == "step" else (30.0,):
                    for contender in contenders(bounds, cost.max_num_seqs):
                        runs.append(simulate(trace, workload, jobs, base, delay, contender, cost,
                                             bounds.ttft_target_s, bounds.min_replicas))
                print(f"{workload.name} {trace} {base:g}x: {time.monotonic() - started:.0f} s", file=sys.stderr)
    args.output.write_text(markdown(runs, cost, bounds, " ".join(["python -m scalesim", *(argv or sys.argv[1:])])))
    plot(_pick(runs, "step", "chat", 0.5, 30.0), args.plot)
    print(f"wrote {args.output} and {args.plot} ({len(runs)} runs, {time.monotonic() - started:.0f} s)")
    return 0


def _pick(runs: list[Figures], trace: str, workload: str, base: float, delay: float) -> list[Figures]:
    key = (trace, workload, base, delay)
    return [r for r in runs if (r.trace, r.workload, r.base_replicas, r.start_delay_s) == key]


if __name__ == "__main__":
    sys.exit(main())

"""`python -m loadkit <experiment> [options]`: every experiment of the kit from one command line.

`python -m loadkit --help` lists the experiments; `python -m loadkit <experiment> --help` gives one's options.
Each experiment's module is imported only when it runs, so the list costs nothing.
"""

from __future__ import annotations

import importlib
import sys

EXPERIMENTS = {  # name -> (module with main(argv), what it does; its doc)
    "bench": ("loadkit.bench.run", "this project against its peers, side by side (docs/benchmarks.md)"),
    "goodput": ("loadkit.goodput.run", "goodput under open-loop overload, peers side by side (docs/goodput.md)"),
    "overload": ("loadkit.overload.run", "overload becomes queueing and fast, honest refusals (docs/overload.md)"),
    "burst": ("loadkit.burst", "issue 15's burst against a running service (docs/overload.md)"),
    "hostile": ("loadkit.hostile.run", "hostile clients beside a polite one (docs/hostile.md)"),
    "tenants": ("loadkit.tenants", "the noisy neighbour: one tenant against two at the default config "
                "(docs/tenants.md)"),
    "fairness": ("loadkit.fairness.run", "issue 28's VTC suites: fair queue, budgets, rate limits against first-come "
                 "(docs/tenants.md)"),
    "autoscaling": ("loadkit.autoscaling", "the default config's 1-2 replicas under a step of load on a local "
                    "cluster (docs/autoscaling.md)"),
    "capacity": ("loadkit.capacity", "the capacity a replica reports through light and full load "
                 "(docs/autoscaling.md)"),
    "routing": ("loadkit.routing.run", "the fleet router against power-of-two on a local cluster (docs/routing.md)"),
    "chaos": ("loadkit.chaos.run", "issue 13's faults under steady load on a local cluster (docs/chaos.md)"),
    "differential": ("loadkit.differential.run", "the same requests to this service and bare vLLM "
                     "(docs/differential.md)"),
    "prefill-share": ("loadkit.prefill_share", "a long prompt beside running streams, per budget (docs/sizing.md)"),
    "probe": ("loadkit.probe", "the refusal probe: a newcomer's view of a service (docs/overload.md)"),
}


def usage() -> str:
    width = max(map(len, EXPERIMENTS))
    lines = ["usage: python -m loadkit <experiment> [options]", "",
             "The load-testing kit's experiments (`python -m loadkit <experiment> --help` for one's options):", ""]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in EXPERIMENTS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, *rest = argv
    if name not in EXPERIMENTS:
        print(f"python -m loadkit: no experiment {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return importlib.import_module(EXPERIMENTS[name][0]).main(rest)


if __name__ == "__main__":
    sys.exit(main())

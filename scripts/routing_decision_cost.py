"""The fleet router's own cost per decision, in this process with nothing else running: `FleetRouter.choose` over
two replicas for prompts of 1,024 shared tokens (one of 20 prefixes) plus 64-500 tokens of their own, each answered
as the engine would, with 64 requests in flight (each finished 64 decisions after it was sent). Prints the router's
own figures over its last 1,024 decisions (the p99 of the wall time and of the thread's CPU time, as `/metrics`
reports them under load: docs/routing.md). `--busy-thread` runs a thread that only computes beside the decisions, and
`--switch-interval-ms` sets how long Python lets a thread hold the GIL while another waits (its default: 5 ms), as
the ingress's other threads would (docs/routing.md, "What the decision's wall time waits for").

    .venv/bin/python scripts/routing_decision_cost.py [--decisions 5000] [--replicas 2] [--busy-thread]
        [--switch-interval-ms 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import deque

from app.host.replica_load import ReplicaLoad
from app.routing.decision import Decision
from app.routing.fleet_router import FleetRouter

IN_FLIGHT = 64
GAP_S = 0.0005  # between decisions the ingress's loop awaits other work, and another thread may take the GIL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--busy-thread", action="store_true", help="a thread that only computes, beside the decisions")
    parser.add_argument("--switch-interval-ms", type=float, default=None, help="sys.setswitchinterval, in ms")
    args = parser.parse_args()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    stop = threading.Event()
    if args.busy_thread:
        threading.Thread(target=_compute_until, args=(stop,), daemon=True).start()
    rng = random.Random(0)
    router = FleetRouter(rng=rng)
    load = ReplicaLoad(serving=True, room=40, in_system=4, wait_s=0.3, prefill_s_per_token=0.0005,
                       per_request_s=0.01, block_tokens=128, cache_blocks=2000)
    loads = {f"replica-{i}": load for i in range(args.replicas)}
    started: deque[Decision] = deque()
    prefixes = [[rng.randrange(49_000) for _ in range(1024)] for _ in range(20)]
    for i in range(args.decisions):
        prompt = prefixes[i % len(prefixes)] + [rng.randrange(49_000) for _ in range(rng.randrange(64, 500))]
        decision = router.choose(loads, prompt)
        assert decision is not None
        best = decision.candidates[0]
        router.answered(decision, best.replica, best.cached_tokens, 0.3, len(prompt))
        if i >= IN_FLIGHT:  # a stream ends as another starts: the replicas keep IN_FLIGHT requests between them
            router.finished(started.popleft())
        started.append(decision)
        time.sleep(GAP_S)
    stop.set()
    figures = router.figures()
    beside = " beside a busy thread" if args.busy_thread else ""
    print(f"{args.decisions} decisions over {args.replicas} replicas{beside} (GIL switch interval "
          f"{sys.getswitchinterval() * 1000:g} ms); the last 1,024: p99 {figures.decision_p99_ms} ms wall, "
          f"{figures.decision_cpu_p99_ms} ms on the thread's CPU")


def _compute_until(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(2000):
            x += i * i  # pure Python: holds the GIL, as rendering a chat template does


if __name__ == "__main__":
    main()

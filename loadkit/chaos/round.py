"""One round of the chaos driver: steady load and long greedy streams on the deployment, one fault injected
under them, and what it cost the clients until the deployment was whole again.

Counted over every answer that ended after the fault began (those in flight at it included): requests,
failures (any non-200, any stream that ended without its finish), long streams not whole (not `max_tokens`
long, or without usage), the choices the ingress continued on another replica and the requests it retried on
another before anything was sent (its own log lines), the longest any client waited for a byte, and the time
from the fault until the deployment had all its replicas with serving engines again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from loadkit.chaos.faults import Fault, Target
from loadkit.long_stream import LongStream
from loadkit.steady_load import SERVED, SteadyLoad
from loadkit.waiting import wait_until

RESUMED = "resumed on replica"  # the ingress's line for each choice continued on another replica
RETRIED = "trying another replica"  # ... and for each request retried before anything was sent
LONG_STREAMS = 2
ANSWER_TOKENS = 48  # the steady load's answers: several seconds each, so a fault finds some in flight


@dataclass(frozen=True)
class RoundResult:
    fault: str
    what: str
    requests: int
    failures: tuple[str, ...]
    long_streams: int
    long_streams_broken: tuple[str, ...]
    migrations: int
    retries: int
    longest_stall_s: float
    capacity_back_s: float | None  # None: not whole again within the round's bound


def run_round(target: Target, fault: Fault, base_url: str, api_key: str, model: str,
              timeout_s: float = 900) -> RoundResult:
    cluster = target.cluster
    resumed, retried = len(cluster.worker_lines(RESUMED)), len(cluster.worker_lines(RETRIED))
    with SteadyLoad(base_url, api_key, model, plain=2, streaming=2, max_tokens=ANSWER_TOKENS) as load:
        load.wait_served(6, what=f"steady load served before the {fault.name}")
        streams = [LongStream(base_url, api_key, model) for _ in range(LONG_STREAMS)]
        for s in streams:
            s.start()
        wait_until(lambda: all(s.chunks >= 3 or s.error for s in streams), timeout_s=300,
                   what="every long stream under way")
        at = time.monotonic()
        whole = fault.inject(target)
        try:
            wait_until(whole, timeout_s=timeout_s, interval_s=1, what=f"the deployment whole after the {fault.name}")
            back: float | None = time.monotonic() - at
        except TimeoutError:
            back = None
        for s in streams:
            s.join(timeout=600)
        if back is not None:
            load.wait_served(6, what=f"the load served after the {fault.name}")
    after = [o for o in load.outcomes if o.ended_at >= at]
    return RoundResult(
        fault=fault.name,
        what=fault.what,
        requests=len(after) + len(streams),
        failures=tuple(o.result for o in after if o.result != SERVED),
        long_streams=len(streams),
        long_streams_broken=tuple(w for w in (s.whole() for s in streams) if w is not None),
        migrations=len(cluster.worker_lines(RESUMED)) - resumed,
        retries=len(cluster.worker_lines(RETRIED)) - retried,
        longest_stall_s=max([o.longest_wait_s for o in after] + [s.longest_gap_s for s in streams]),
        capacity_back_s=back,
    )

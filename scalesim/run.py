"""One simulated run (a trace, a base load, a start delay, a policy) and its figures."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scalesim.contenders import Contender
from scalesim.fleet import SimFleet
from scalesim.replica import CostModel, Job
from scalesim.traces import DURATION_S, PEAK, STEP_AT_S, Workload

DT = 0.25  # engine time step, s
DECIDE_S = 1.0  # how often the policy is asked (Serve's control loop asks every 0.1 s; its delays are in seconds)


@dataclass
class Figures:
    trace: str
    workload: str
    base_replicas: float  # the base load, in replicas' worth of decode capacity at 1x
    start_delay_s: float
    policy: str
    offered: int = 0
    in_target: int = 0  # first token within the target
    refused: int = 0
    moved: int = 0
    replica_s: float = 0.0
    ups: int = 0
    downs: int = 0
    to_capacity_s: float | None = None  # from the step to enough replicas serving for the peak (step trace)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, target, running)

    @property
    def attainment(self) -> float:
        return self.in_target / self.offered if self.offered else 1.0


def simulate(trace: str, workload: Workload, jobs: list[Job], base_replicas: float, start_delay_s: float,
             contender: Contender, cost: CostModel, ttft_target_s: float, min_replicas: int = 1) -> Figures:
    fleet = SimFleet(cost, min_replicas, start_delay_s, ttft_target_s, workload.output_share)
    figures = Figures(trace, workload.name, base_replicas, start_delay_s, contender.name, offered=len(jobs))
    needed = math.ceil(base_replicas * PEAK - 1e-9)
    queue = sorted((Job(j.arrival, j.prompt, j.max_tokens, j.output) for j in jobs), key=lambda j: j.arrival)
    nxt, now, next_decision = 0, 0.0, 0.0
    while now < DURATION_S or any(r.ongoing for r in fleet.replicas):
        while nxt < len(queue) and queue[nxt].arrival < now + DT:
            fleet.offer(queue[nxt], queue[nxt].arrival)
            nxt += 1
        fleet.advance(now, DT)
        figures.replica_s += DT * len(fleet.replicas)
        now += DT
        if now >= next_decision and now <= DURATION_S:
            next_decision = now + DECIDE_S
            fleet.record(now)
            before = fleet.target
            target = contender.decide(now, before, fleet.reported(now))
            figures.ups += target > before
            figures.downs += target < before
            fleet.scale_to(target, now)
            running = len(fleet.running(now))
            figures.timeline.append((now, fleet.target, running))
            if trace == "step" and figures.to_capacity_s is None and now >= STEP_AT_S and running >= needed:
                figures.to_capacity_s = now - STEP_AT_S
    figures.refused, figures.moved = fleet.counts.refused, fleet.counts.moved
    figures.in_target = sum(1 for j in fleet.counts.finished if j.ttft is not None and j.ttft <= ttft_target_s)
    return figures


def base_rps(base_replicas: float, cost: CostModel, workload: Workload) -> float:
    """Requests per second that ask `base_replicas` replicas' whole engine time: each request's prefill plus its
    share of decode steps at a full batch."""
    per_request_s = (sum(workload.prompt) / 2 * cost.prefill_s_per_token
                     + workload.mean_output * cost.step_s(cost.max_num_seqs) / cost.max_num_seqs)
    return base_replicas / per_request_s

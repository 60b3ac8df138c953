"""The autoscaling simulation (scalesim/): its engine keeps the fake engine's cost model, and on the step trace the
service's policy scales up once after the step and down once after it, losing nothing."""

from __future__ import annotations

import pytest

from scalesim.contenders import Bounds, contenders
from scalesim.replica import CostModel, Job, SimReplica
from scalesim.run import base_rps, simulate
from scalesim.traces import STEP_AT_S, STEP_END_S, TRACES, WORKLOADS, arrivals


def test_a_lone_request_takes_its_prefill_then_one_decode_step_per_token():
    cost = CostModel(prefill_s_per_token=0.01, token_delay_s=0.1, decode_s_per_batch=0.0, max_num_seqs=4)
    replica = SimReplica(cost, ready_at=0.0)
    job = Job(arrival=0.0, prompt=50, max_tokens=8, output=4)
    assert replica.first_token_s(50) == pytest.approx(0.5)
    replica.queue.append(job)
    done = replica.advance(0.0, 2.0)
    assert done == [job]
    assert job.first_token == pytest.approx(0.5) and job.done_at == pytest.approx(0.8)  # 3 more tokens at 0.1 s


def test_a_full_replica_predicts_the_wait_for_a_slot():
    cost = CostModel(prefill_s_per_token=0.0, token_delay_s=0.1, decode_s_per_batch=0.0, max_num_seqs=1)
    replica = SimReplica(cost, ready_at=0.0)
    replica.queue.append(Job(arrival=0.0, prompt=1, max_tokens=20, output=20))
    replica.advance(0.0, 0.05)  # its first token at once (no prefill), then half a step: 18.5 tokens left
    assert replica.first_token_s(1) == pytest.approx(1.85)


def test_the_service_s_policy_follows_a_step_with_one_scale_event_each_way():
    cost, bounds, workload = CostModel(), Bounds(), WORKLOADS["chat"]
    jobs = arrivals(TRACES["step"], base_rps(0.5, cost, workload), workload, seed=1)
    ours = next(c for c in contenders(bounds, cost.max_num_seqs) if c.name == "tokens")
    figures = simulate("step", workload, jobs, 0.5, 30.0, ours, cost, bounds.ttft_target_s)
    before = [running for t, _, running in figures.timeline if t < STEP_AT_S]
    during = [running for t, _, running in figures.timeline if STEP_AT_S + 90 <= t < STEP_END_S]
    assert set(before) == {1} and min(during) >= 2 and figures.timeline[-1][2] == 1
    assert (figures.ups, figures.downs) == (1, 1)
    assert figures.to_capacity_s is not None and figures.to_capacity_s < 90
    assert len(figures.timeline) and figures.offered == len(jobs)
    assert figures.in_target + figures.refused <= figures.offered and figures.attainment > 0.8

"""The policies compared, each asked what Serve's controller asks a policy, with Serve 2.60's own steps after it
(its scaling factors, `upscale_delay_s`/`downscale_delay_s` held in simulated time, and the bounds):

- `tokens`: the service's policy (app/scaling/serve_policy.TokenDemandPolicy), on the replicas' token demand;
- `serve-default`: Serve's default, `replica_queue_length_autoscaling_policy`, on ongoing requests per replica, at
  Serve's default `target_ongoing_requests` (2) and at an operator's tuning (3/4 of the replica's batch, as
  configs/kuberay/rayservice-gpu.yaml had: 48 of 64);
- `queue-depth`: the rule KEDA applies to vLLM's `num_requests_waiting` (Kubernetes HPA's: replicas x average waiting
  per replica / target, with its 10 % tolerance).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray.serve._private.common import TimeStampedValue
from ray.serve.autoscaling_policy import (
    _apply_delay_logic,
    _apply_scaling_factors,
    replica_queue_length_autoscaling_policy,
)
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from app.scaling.serve_policy import TokenDemandPolicy

QUEUE_TARGET = 4  # waiting requests per replica (KEDA's threshold)
HPA_TOLERANCE = 0.1


@dataclass(frozen=True)
class Bounds:
    min_replicas: int = 1
    max_replicas: int = 16
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 120.0
    look_back_s: float = 30.0
    ttft_target_s: float = 10.0
    target_utilization: float = 0.8


Policy = Callable[[AutoscalingContext], tuple[float, dict[str, Any]]]


def _queue_depth(ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
    waiting = sum((ctx.aggregated_metrics or {}).get("waiting", {}).values())
    current = ctx.current_num_replicas
    ratio = waiting / (current * QUEUE_TARGET) if current else 0.0
    return (current if abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(current * ratio)), {}


@dataclass
class Contender:
    name: str
    policy: Policy
    config: AutoscalingConfig
    state: dict[str, Any] = field(default_factory=dict)

    def decide(self, now: float, target: int, reported: dict[str, dict[int, list[tuple[float, float]]]]) -> int:
        """The replica count Serve would set now, from the samples the running replicas pushed: their averages over
        the look-back (`aggregated_metrics`) and the samples themselves (`raw_metrics`)."""
        ids = sorted(reported.get("ongoing", {}))
        if not ids:  # nothing has reported yet: Serve keeps the target
            return target
        raw = {name: {i: [TimeStampedValue(t, v) for t, v in series] for i, series in by.items()}
               for name, by in reported.items()}
        means = {name: {i: sum(v for _, v in series) / len(series) for i, series in by.items()}
                 for name, by in reported.items()}
        ctx = AutoscalingContext(
            deployment_id=None, deployment_name="engine", app_name="sim",  # type: ignore[arg-type]
            current_num_replicas=len(ids), target_num_replicas=target, running_replicas=ids,  # type: ignore[arg-type]
            total_num_requests=sum(means["ongoing"].values()), total_queued_requests=0.0,
            aggregated_metrics=means, raw_metrics=raw,  # type: ignore[arg-type]
            capacity_adjusted_min_replicas=self.config.min_replicas,
            capacity_adjusted_max_replicas=self.config.max_replicas,
            policy_state=self.state, last_scale_up_time=None, last_scale_down_time=None, current_time=now,
            config=self.config)
        desired, _ = self.policy(ctx)
        desired = _apply_scaling_factors(desired, len(ids), self.config)
        decided, self.state = _apply_delay_logic(max(0, desired), target, self.config, self.state, _now=now)
        return max(self.config.min_replicas, min(self.config.max_replicas, decided))


def contenders(bounds: Bounds, batch: int) -> list[Contender]:
    def config(**extra: Any) -> AutoscalingConfig:
        return AutoscalingConfig(min_replicas=bounds.min_replicas, max_replicas=bounds.max_replicas,
                                 upscale_delay_s=bounds.upscale_delay_s, downscale_delay_s=bounds.downscale_delay_s,
                                 look_back_period_s=bounds.look_back_s, **extra)

    tokens = TokenDemandPolicy(bounds.min_replicas, bounds.max_replicas, bounds.target_utilization,
                               bounds.ttft_target_s)
    tuned = max(1, round(0.75 * batch))
    return [
        Contender("tokens", tokens, config()),
        Contender("serve-default (2)", replica_queue_length_autoscaling_policy, config(target_ongoing_requests=2)),
        Contender(f"serve-default ({tuned})", replica_queue_length_autoscaling_policy,
                  config(target_ongoing_requests=tuned)),
        Contender("queue-depth", _queue_depth, config()),
    ]

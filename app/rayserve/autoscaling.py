"""The engine deployments' Ray Serve autoscaling policy (Ray 2.60's `AutoscalingConfig.policy`): each replica's
`record_autoscaling_stats` (host/replica_load.scaling_figures), averaged by Serve over the look-back window, into
scaling/policy.py's answer. Serve applies the delays and bounds of the deployment's `autoscaling_config` to it.

Serve 2.60 gives a policy its own deployment's figures only: the ingress's refusals at once (app/routing/) do not
reach it. They happen when every replica predicts a first token past the target, which the replicas' `wait_s`
shows, and the policy scales up on that.
"""

from __future__ import annotations

from typing import Any

from ray.serve.config import AutoscalingContext

from app.config.autoscaling import AutoscalingSettings
from app.scaling.policy import Knobs, ReplicaFigures, desired_replicas


class TokenDemandPolicy:
    """Built by Serve once per deployment with `policy_kwargs` (`kwargs_for`), then called every control-loop tick."""

    def __init__(self, min_replicas: int, max_replicas: int, target_utilization: float,
                 ttft_target_s: float | None):
        self.knobs = Knobs(min_replicas, max_replicas, target_utilization, ttft_target_s)

    def __call__(self, ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        replicas = []
        for replica in ctx.running_replicas:
            def value(name: str, replica: Any = replica) -> float | None:
                return metrics.get(name, {}).get(replica)

            replicas.append(ReplicaFigures(served=value("served") or 0.0, refused=value("refused") or 0.0,
                                           capacity=value("capacity"), wait_s=value("wait_s")))
        return desired_replicas(ctx.current_num_replicas, replicas, self.knobs), ctx.policy_state


def kwargs_for(settings: AutoscalingSettings, ttft_target_s: float | None) -> dict[str, Any]:
    return {"min_replicas": settings.min_replicas, "max_replicas": settings.max_replicas,
            "target_utilization": settings.target_utilization, "ttft_target_s": ttft_target_s}


def serve_autoscaling_config(settings: AutoscalingSettings, ttft_target_s: float | None) -> dict[str, Any]:
    """Serve's `autoscaling_config` for an engine deployment."""
    return {
        "min_replicas": settings.min_replicas,
        "max_replicas": settings.max_replicas,
        "initial_replicas": settings.min_replicas,
        "upscale_delay_s": settings.upscale_delay_s,
        "downscale_delay_s": settings.downscale_delay_s,
        "look_back_period_s": settings.look_back_s,
        "policy": {"policy_function": f"{__name__}:TokenDemandPolicy",
                   "policy_kwargs": kwargs_for(settings, ttft_target_s)},
    }

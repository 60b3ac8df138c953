"""The engine deployments' Ray Serve autoscaling policy (Ray 2.60's `AutoscalingConfig.policy`) and the
`autoscaling_config` that names it: each replica's `record_autoscaling_stats` (host/replica_load.scaling_figures),
averaged by Serve over the look-back window, into scaling/policy.py's answer. Serve applies the delays and bounds of
the deployment's `autoscaling_config` to it.

Serve 2.60 gives a policy its own deployment's figures only; the ingress's refusals at once (app/routing/) reach it
because the ingress reports them to an engine replica about once a second (rayserve/unmet_demand.py), which
counts them as refused demand. The other way, the policy publishes each decision with its inputs
(scaling/decision.py) in Ray's internal key-value store, at most once a second, for the ingress's /stats, /metrics
and the Retry-After of refusals while a replica starts (rayserve/scaling_view.py).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import replace
from typing import Any

from ray.experimental import internal_kv
from ray.serve.config import AutoscalingContext

from app.config.autoscaling import AutoscalingSettings
from app.scaling.decision import KV_NAMESPACE, ScalingDecision, kv_key
from app.scaling.policy import Knobs, ReplicaFigures, desired_replicas, full_batch_capacities, planning_capacities

# Under "ray.serve": the policy runs in Serve's controller, whose log file takes that logger's records only.
log = logging.getLogger("ray.serve").getChild(__name__)
PUBLISH_EVERY_S = 1.0
STARTING_SINCE = "app_starting_since"  # our key in Serve's policy state: when the target rose above those running
LAST_CAPACITY = "app_last_capacity"  # ... and the fleet's last measured capacity of one replica
BY_SIZE = "app_capacity_by_size"  # ... and one replica's, measured near a full batch, by fleet size ("2": 85.0)
FLEET = "app_fleet"  # ... and the replicas running, since when, and how many before: [2, 1733390000.0, 1]
# After the replicas running change, their figures belong to the fleet before for this long: the replica's own 10 s
# window, Serve's 30 s look-back, and a stopped replica's drain (30 s) beside them. Just after a scale-down the kept
# replica still reported the 31 output tokens/s of its contended full batches, and the policy asked for two again.
SETTLE_S = 40.0

# Scale-up reads each replica's samples of this many seconds before its newest: the step of load shows there at
# once, where the look-back average lags it by half its window.
RECENT_S = 10.0
# How often each replica records and pushes its figures to Serve's controller. Serve 2.60's default is 10 s, and its
# RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S variables are read by nothing; the deprecated `metrics_interval_s`
# is what its replicas and handles use. At 10 s a step reached the policy 7-18 s late (the real rounds of
# docs/autoscaling.md), and a controller tick that saw no new report reset Serve's delay.
REPORT_EVERY_S = 2.0
_FIGURES = ("served", "refused", "capacity", "wait_s", "full_batch")


def _recent(raw: dict[str, dict[Any, list[Any]]]) -> dict[str, dict[Any, float]]:
    """Each replica's mean of each figure over the RECENT_S before its newest sample (Serve's raw time series)."""
    out: dict[str, dict[Any, float]] = {}
    for name, by_replica in raw.items():
        for replica, series in by_replica.items():
            if series:
                newest = max(s.timestamp for s in series)
                values = [s.value for s in series if s.timestamp >= newest - RECENT_S]
                out.setdefault(name, {})[replica] = sum(values) / len(values)
    return out


class TokenDemandPolicy:
    """Built by Serve once per deployment with `policy_kwargs` (`kwargs_for`), then called every control-loop tick."""

    def __init__(self, min_replicas: int, max_replicas: int, target_utilization: float,
                 ttft_target_s: float | None):
        self.knobs = Knobs(min_replicas, max_replicas, target_utilization, ttft_target_s)
        self._published_at = 0.0
        self._logged: int | None = None  # the desire last logged, while it differs from the replicas there are

    def __call__(self, ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
        state, now = ctx.policy_state, time.time()
        stable = _figures(ctx.running_replicas, ctx.aggregated_metrics or {})
        recent = _figures(ctx.running_replicas, _recent(getattr(ctx, "raw_metrics", None) or {})) or None
        stable, recent = _with_known_capacity(state, stable, recent)
        measured_at = _measured_at(state, ctx.current_num_replicas, now)
        by_size = _capacity_by_size(ctx, recent or stable, measured_at)
        desired = desired_replicas(ctx.current_num_replicas, stable, self.knobs, recent, by_size, measured_at)
        if desired != ctx.current_num_replicas and desired != self._logged:  # Serve logs a change, not its inputs
            log.info("%s: %d -> %d replicas on look-back %s, recent %s", ctx.deployment_name,
                     ctx.current_num_replicas, desired, stable, recent)
        self._logged = desired if desired != ctx.current_num_replicas else None
        if ctx.target_num_replicas > ctx.current_num_replicas:
            state.setdefault(STARTING_SINCE, now)
        else:
            state.pop(STARTING_SINCE, None)
        if now - self._published_at >= PUBLISH_EVERY_S:
            self._published_at = now
            _publish(ctx, _decision(ctx, desired, stable, now))
        return desired, state


def _with_known_capacity(state: dict[str, Any], stable: list[ReplicaFigures], recent: list[ReplicaFigures] | None
                         ) -> tuple[list[ReplicaFigures], list[ReplicaFigures] | None]:
    """With no replica's pace measured in either window (a new replica, or the one kept by a scale-down), the fleet's
    last measured capacity: the replicas are alike, and an unknown capacity reads as busy (policy.py), which, with
    the refusals still in the look-back, scaled straight back up after a scale-down (seen on the local cluster).
    Measured is what policy.py takes the median of: both windows."""
    measured = planning_capacities([*stable, *(recent or ())])
    if measured:
        state[LAST_CAPACITY] = statistics.median(measured)
        return stable, recent
    known = state.get(LAST_CAPACITY)
    if known is None:
        return stable, recent
    return [replace(r, capacity=known) for r in stable], recent and [replace(r, capacity=known) for r in recent]


def _measured_at(state: dict[str, Any], running: int, now: float) -> int:
    """The fleet size the replicas' figures were measured at: the one before for SETTLE_S after a change."""
    size, since, before = state.setdefault(FLEET, [running, 0.0, running])
    if size != running:
        size, since, before = running, now, size
        state[FLEET] = [size, since, before]
    return before if now - since < SETTLE_S else size


def _capacity_by_size(ctx: AutoscalingContext, recent: list[ReplicaFigures], measured_at: int) -> dict[int, float]:
    """One replica's capacity by fleet size, renewed from the last seconds' full batches while the fleet is steady (a
    replica loading beside the others takes their cores; a figure averaged across a change belongs to neither)."""
    full = full_batch_capacities(recent)
    steady = ctx.target_num_replicas == ctx.current_num_replicas == measured_at
    if full and steady:  # str keys: the state is Serve's to keep
        ctx.policy_state.setdefault(BY_SIZE, {})[str(ctx.current_num_replicas)] = statistics.median(full)
    return {int(size): capacity for size, capacity in ctx.policy_state.get(BY_SIZE, {}).items()}


def _decision(ctx: AutoscalingContext, desired: int, stable: list[ReplicaFigures], now: float) -> ScalingDecision:
    capacities = planning_capacities(stable)
    waits = [r.wait_s for r in stable if r.wait_s is not None]
    starts = [v for v in ((ctx.aggregated_metrics or {}).get("start_s") or {}).values() if v]
    return ScalingDecision(
        desired=desired, target=ctx.target_num_replicas, running=ctx.current_num_replicas,
        served=sum(r.served for r in stable), refused=sum(r.refused for r in stable),
        capacity=statistics.median(capacities) if capacities else None, wait_s=min(waits) if waits else None,
        start_s=statistics.median(starts) if starts else None, decided_at=now,
        starting_since=ctx.policy_state.get(STARTING_SINCE))


def _publish(ctx: AutoscalingContext, decision: ScalingDecision) -> None:
    if not internal_kv._internal_kv_initialized():  # outside a Ray cluster (the simulation, unit tests)
        return
    try:
        internal_kv._internal_kv_put(kv_key(ctx.app_name or "", ctx.deployment_name), decision.to_json(),
                                     overwrite=True, namespace=KV_NAMESPACE)
    except Exception as err:  # a lost figure for /stats, nothing more
        log.debug("could not publish the scaling decision: %s", err)


def _figures(running: list[Any], metrics: dict[str, dict[Any, float]]) -> list[ReplicaFigures]:
    """The running replicas' figures (those that reported none are left out)."""
    out = []
    for replica in running:
        values = {name: metrics.get(name, {}).get(replica) for name in _FIGURES}
        if any(v is not None for v in values.values()):
            out.append(ReplicaFigures(served=values["served"] or 0.0, refused=values["refused"] or 0.0,
                                      capacity=values["capacity"], wait_s=values["wait_s"],
                                      full_batch=values["full_batch"] or 0.0))
    return out


def kwargs_for(settings: AutoscalingSettings, ttft_target_s: float | None) -> dict[str, Any]:
    return {"min_replicas": settings.min_replicas, "max_replicas": settings.max_replicas,
            "target_utilization": settings.target_utilization, "ttft_target_s": ttft_target_s}


def serve_autoscaling_config(settings: AutoscalingSettings, ttft_target_s: float | None) -> dict[str, Any]:
    """Serve's `autoscaling_config` for an engine deployment: the same bounds and delays for either policy."""
    config: dict[str, Any] = {
        "min_replicas": settings.min_replicas,
        "max_replicas": settings.max_replicas,
        "initial_replicas": settings.min_replicas,
        "upscale_delay_s": settings.upscale_delay_s,
        "downscale_delay_s": settings.downscale_delay_s,
        "look_back_period_s": settings.look_back_s,
        "metrics_interval_s": REPORT_EVERY_S,
    }
    if settings.policy == "ongoing_requests":  # no `policy`: Serve's default, on requests in flight per replica
        if settings.target_ongoing_requests is not None:
            config["target_ongoing_requests"] = settings.target_ongoing_requests
        return config
    config["policy"] = {"policy_function": f"{__name__}:TokenDemandPolicy",
                        "policy_kwargs": kwargs_for(settings, ttft_target_s)}
    return config

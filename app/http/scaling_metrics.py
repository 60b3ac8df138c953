"""The autoscaling policy's last decision per model (app/scaling/decision.py), for /metrics: what it decided and
what it decided on."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from app.http.metrics import or_nan
from app.scaling.decision import ScalingDecision


class ScalingCollector:
    def __init__(self, scaling: Mapping[str, ScalingDecision]):
        self._scaling = scaling

    def collect(self) -> Iterable[Metric]:
        replicas = GaugeMetricFamily(
            "app_autoscaling_replicas", "Engine replicas: what the autoscaling policy asked for (desired), Serve's "
            "target and those running, at its last decision.", labels=["model_name", "kind"])
        demand = GaugeMetricFamily(
            "app_autoscaling_demand_tokens_per_second", "Decode steps per second the policy saw: served, and refused "
            "by time (each refused request as the output it would have had).", labels=["model_name", "kind"])
        capacity = GaugeMetricFamily(
            "app_autoscaling_replica_capacity_tokens_per_second", "One replica's output tokens per second at a full "
            "batch, as the replicas measured it (the median; NaN until measured).", labels=["model_name"])
        ready = GaugeMetricFamily(
            "app_autoscaling_replica_ready_in_seconds", "While a new replica starts: when it is expected to serve "
            "(NaN: none starting).", labels=["model_name"])
        now = time.time()
        for model, d in self._scaling.items():
            for kind, value in (("desired", d.desired), ("target", d.target), ("running", d.running)):
                replicas.add_metric([model, kind], value)
            demand.add_metric([model, "served"], d.served)
            demand.add_metric([model, "refused"], d.refused)
            capacity.add_metric([model], or_nan(d.capacity))
            ready.add_metric([model], or_nan(d.ready_in_s(now)))
        yield from (replicas, demand, capacity, ready)

"""What the fleet router did, for /stats and /metrics: per replica, the requests it routed, the cached tokens it
predicted against those the engine realized (its precision), and the first tokens it predicted against those that
came; per model, its refusals and its decision time."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ReplicaRouting:
    """What this router did with one replica (for /stats and /metrics)."""

    routed: int = 0
    predicted_cached_tokens: int = 0  # over answered requests: what the router expected the cache to hold
    realized_cached_tokens: int = 0  # ... what the engine reported
    confirmed_cached_tokens: int = 0  # ... the part of the prediction the engine realized
    first_tokens: int = 0
    predicted_first_token_s: float = 0.0  # summed over `first_tokens`
    measured_first_token_s: float = 0.0
    estimated_blocks: int = 0  # blocks the estimate holds now

    @property
    def precision(self) -> float | None:
        """The share of predicted cached tokens the engine realized (None: nothing predicted yet)."""
        return self.confirmed_cached_tokens / self.predicted_cached_tokens if self.predicted_cached_tokens else None


@dataclass(frozen=True)
class FleetFigures:
    """The router's figures for one model: per replica, requests refused here, its decision time (p99: wall, and
    the deciding thread's CPU)."""

    replicas: dict[str, ReplicaRouting]
    refused: int = 0
    decision_p99_ms: float | None = None
    decision_cpu_p99_ms: float | None = None

    def as_json(self) -> dict[str, object]:
        return {"refused_over_time_target": self.refused, "decision_p99_ms": self.decision_p99_ms,
                "decision_cpu_p99_ms": self.decision_cpu_p99_ms,
                "replicas": {r: {**asdict(f), "precision": f.precision} for r, f in self.replicas.items()}}

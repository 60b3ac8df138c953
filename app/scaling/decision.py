"""ScalingDecision: the autoscaling policy's last decision for one engine deployment and its inputs, as the policy
publishes it (scaling/serve_policy.py, in Ray's internal key-value store) and the ingress reads it back
(rayserve/scaling_view.py): for /stats and /metrics, and for the Retry-After of the requests refused while a new
replica starts.

While Serve's target is above the replicas running, a scale-up is under way: the new replica is expected to serve
`start_s` after it was asked for, `start_s` being how long the running replicas took from their process's start to
serving (the median; START_S until one has said)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

START_S = 60.0  # a replica's start when none has reported its own yet: a CPU engine's load with margin
KV_NAMESPACE = "app-llm-serve"


def kv_key(app: str, deployment: str) -> str:
    return f"scaling/{app}/{deployment}"


@dataclass(frozen=True)
class ScalingDecision:
    desired: int  # what the policy answered (Serve applies its delays and bounds to it)
    target: int  # Serve's target when asked
    running: int  # replicas running then
    served: float  # decode steps per second, summed over the replicas (the look-back average)
    refused: float  # ... refused by time, by the replicas and the ingress
    capacity: float | None  # one replica's output tokens per second at a full batch (the median)
    wait_s: float | None  # the soonest replica's next first token
    start_s: float | None  # how long a replica took to start (the median of those that said)
    decided_at: float  # wall clock (time.time())
    starting_since: float | None = None  # when Serve's target rose above the replicas running (wall clock)

    def ready_in_s(self, now: float) -> float | None:
        """Seconds until the replica being started is expected to serve (None: no scale-up under way)."""
        if self.starting_since is None or self.target <= self.running:
            return None
        return max(0.0, self.starting_since + (self.start_s or START_S) - now)

    def retry_after_s(self, refused_after_s: float, now: float) -> float:
        """Retry-After for a request refused by time: at least when the new replica is expected, while one starts
        (a retry before then meets the same full replicas); at most 60 s."""
        ready = self.ready_in_s(now)
        return refused_after_s if ready is None else min(60.0, max(refused_after_s, math.ceil(ready)))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> ScalingDecision:
        return cls(**json.loads(text))

    def as_stats(self, now: float) -> dict[str, object]:
        return {**asdict(self), "ready_in_s": self.ready_in_s(now)}

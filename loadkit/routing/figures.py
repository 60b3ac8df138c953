"""The routing benchmark's figures: what /metrics says before and after a workload (vLLM's prefix-cache counters and
prompt tokens per replica, the fleet router's own counters), and one system's row for one workload over its rounds.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from loadkit.routing.drive import Outcome
from loadkit.stats import percentile

COUNTERS = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", "vllm:prompt_tokens", "app_routed_requests",
            "app_routed_predicted_cached_tokens", "app_routed_confirmed_cached_tokens", "app_routed_first_tokens",
            "app_routed_predicted_first_token_seconds", "app_routed_measured_first_token_seconds")
# The fleet router's decision time p99: wall, and on the deciding thread's CPU (gauges: kept as read after a workload).
DECISION_GAUGES = ("app_routing_decision_p99_seconds", "app_routing_decision_cpu_p99_seconds")


def scrape(text: str) -> dict[str, dict[str, float]]:
    """counter name -> replica -> value (summed over other labels); the decision-time gauges under their own names."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in COUNTERS:
                replica = sample.labels.get("replica", "")
                out[name][replica] = out[name].get(replica, 0.0) + sample.value
            elif name in DECISION_GAUGES:
                out[name][""] = sample.value
    return out


def delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {name: {r: v - before.get(name, {}).get(r, 0.0) for r, v in per.items()} for name, per in after.items()}


@dataclass
class Row:
    """One system on one workload, pooled over its rounds."""

    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    counters: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    decision_p99_s: float | None = None  # the worst over its rounds
    decision_cpu_p99_s: float | None = None
    shares: list[float] = field(default_factory=list)  # each round's busiest replica's share of prompt tokens

    def add(self, outcomes: list[Outcome], wall_s: float, counted: dict[str, dict[str, float]]) -> None:
        self.outcomes += outcomes
        self.wall_s += wall_s
        prompt = counted.get("vllm:prompt_tokens", {})
        if sum(prompt.values()):  # per round: each deployment's replicas have ids of their own
            self.shares.append(max(prompt.values()) / sum(prompt.values()))
        for name, per in counted.items():
            if name in DECISION_GAUGES:
                value = per.get("", float("nan"))
                if value == value:  # not NaN
                    attr = "decision_p99_s" if name == DECISION_GAUGES[0] else "decision_cpu_p99_s"
                    setattr(self, attr, max(getattr(self, attr) or 0.0, value))
                continue
            for replica, value in per.items():
                self.counters[name][replica] = self.counters[name].get(replica, 0.0) + value

    def _total(self, name: str) -> float:
        return sum(self.counters.get(name, {}).values())

    def served(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200]

    def failed(self) -> int:
        return len(self.outcomes) - len(self.served())

    def ttft(self, q: float) -> float | None:
        return percentile([o.ttft_s for o in self.served() if o.ttft_s is not None], q)

    def e2e(self, q: float) -> float | None:
        return percentile([o.e2e_s for o in self.served() if o.e2e_s is not None], q)

    def tokens_per_s(self) -> float | None:
        return sum(o.output_tokens for o in self.served()) / self.wall_s if self.wall_s else None

    def hit_rate(self) -> float | None:
        """vLLM's prefix-cache counters where the system exposes them, else the answers' own cached tokens over their
        prompt tokens (the same ratio as the engine counts it, read at the client: Ray Serve LLM's rows)."""
        queries = self._total("vllm:prefix_cache_queries")
        if queries:
            return self._total("vllm:prefix_cache_hits") / queries
        prompt = sum(o.prompt_tokens for o in self.served())
        return sum(o.cached_tokens for o in self.served()) / prompt if prompt else None

    def busiest_share(self) -> float | None:
        """The largest replica's share of the prompt tokens the engines processed, averaged over the rounds."""
        return sum(self.shares) / len(self.shares) if self.shares else None

    def precision(self) -> float | None:
        predicted = self._total("app_routed_predicted_cached_tokens")
        return self._total("app_routed_confirmed_cached_tokens") / predicted if predicted else None

    def first_token_bias(self) -> float | None:
        """Measured over predicted first tokens, summed (1.0: the router's predictions were right on average)."""
        predicted = self._total("app_routed_predicted_first_token_seconds")
        return self._total("app_routed_measured_first_token_seconds") / predicted if predicted else None

"""Prometheus metrics of the ingress, and the engines' own figures, for GET /metrics.

Request, refusal, disconnect and latency metrics are measured in the ingress,
where the client's view of latency is. Engine figures (queue depth, requests in
the engine, KV cache usage, preemptions, token counters) are read from each
model's replica at scrape time and named as vLLM names them where they mean the
same thing. Each app gets its own registry, so several apps (tests) never clash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from app.host.stats import ReplicaStats
    from app.routing.figures import FleetFigures, ReplicaRouting

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "app_requests",
            "HTTP requests answered, by model, endpoint and status.",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.refusals = Counter(
            "app_refusals",
            "Requests refused, by reason (queue_full, queue_timeout, "
            "context_length_exceeded, request_timeout, invalid_api_key, request_too_large, ...).",
            ["model", "reason"],
            registry=r,
        )
        self.tenant_requests = Counter(
            "app_tenant_requests",
            "HTTP requests answered, by tenant (configured tenants and keys by name, every client address as "
            "`by-address`) and status.",
            ["tenant", "status"],
            registry=r,
        )
        self.retries_held = Counter(
            "app_retries_held", "Requests back on a connection before their Retry-After, held until it.", registry=r
        )
        self.client_aborts = Counter(
            "app_client_disconnects",
            "Requests whose client went away before the end; their engine requests were aborted.",
            ["model", "endpoint"],
            registry=r,
        )
        self.ttft = Histogram(
            "app_time_to_first_token_seconds",
            "From request arrival to the first generated token.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "app_inter_token_latency_seconds",
            "Between consecutive streamed chunks.",
            ["model"],
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.loop_lag = Histogram(
            "app_event_loop_lag_seconds",
            "How much later than asked a 50 ms heartbeat on the HTTP process's event loop ran: the stall every "
            "request on that loop suffered.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "app_e2e_request_latency_seconds",
            "From request arrival to the last byte of a served request.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def render(self, replica_stats: Mapping[str, Mapping[str, ReplicaStats | None]],
               retried: Mapping[str, Mapping[str, int]] | None = None,
               migrated: Mapping[str, Mapping[str, int]] | None = None,
               routing: Mapping[str, FleetFigures] | None = None, extra: Iterable[Collector] = ()) -> bytes:
        """`replica_stats`: per model, every replica's figures by its id (None: it did not answer; it is reported
        down), each series labelled with its `replica` (sum by model_name for the model's figure).
        `retried`: per model, requests the ingress tried again on another replica, by the first refusal's reason
        (`HandleBackend.retried`); `migrated`: per model, choices resumed on another replica after
        their replica failed mid-answer, and requests that could not be (`HandleBackend.migrated`); `routing`: per
        fleet-routed model, its router's figures (app/routing/); `extra`: more collectors (the autoscaling policy's
        decisions, http/scaling_metrics.py)."""
        return (generate_latest(self.registry) + generate_latest(_Snapshot(replica_stats, retried, migrated))
                + generate_latest(_Routing(routing or {})) + b"".join(generate_latest(c) for c in extra))


def or_nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)


class _Snapshot:
    """A one-off collector over stats already fetched from the engine replicas."""

    def __init__(self, stats: Mapping[str, Mapping[str, ReplicaStats | None]],
                 retried: Mapping[str, Mapping[str, int]] | None = None,
                 migrated: Mapping[str, Mapping[str, int]] | None = None):
        self._stats = stats
        self._retried = retried or {}
        self._migrated = migrated or {}

    _GAUGES: dict[str, tuple[str, Callable[[ReplicaStats], float]]] = {
        "app_queue_depth": (
            "Requests waiting for an engine slot in the replica's admission queue.",
            lambda s: s.admission.waiting,
        ),
        "app_requests_admitted": ("Requests admitted into the engine by the replica.", lambda s: s.admission.running),
        "app_requests_aside": ("Requests out of the engine while their clients do not read.",
                               lambda s: s.admission.aside),
        "app_token_budget_in_use": (
            "prompt + max_tokens of admitted requests.",
            lambda s: s.admission.tokens_in_use,
        ),
        "app_token_budget": ("Most prompt + max_tokens admitted at once.", lambda s: s.admission.token_budget),
        "app_engine_healthy": ("1 while the model's engine serves.", lambda s: 1 if s.healthy else 0),
        "vllm:num_requests_running": (
            "Requests in the engine (vLLM's unfinished requests).",
            lambda s: s.engine.running,
        ),
        "vllm:num_requests_waiting": ("Requests the engine's scheduler holds waiting.", lambda s: s.engine.waiting),
        "vllm:kv_cache_usage_perc": ("KV cache usage, 0 to 1.", lambda s: s.engine.kv_cache_usage),
        "app_prefill_tokens_per_second": (
            "Prompt tokens the engine prefills per second, as the replica measured it (NaN: not yet).",
            lambda s: or_nan(s.pace.prefill_tokens_per_s),
        ),
        "app_decode_seconds_per_token": (
            "One stream's seconds per output token at the current batch, on steps with no prefill (NaN: not yet).",
            lambda s: or_nan(s.pace.decode_s_per_token),
        ),
        "app_predicted_time_to_first_token_seconds": (
            "The latest arrival's predicted time to its first token (NaN: not yet predicted).",
            lambda s: or_nan(s.admission.predicted_first_token_s),
        ),
    }
    _COUNTERS: dict[str, tuple[str, Callable[[ReplicaStats], float]]] = {
        "vllm:num_preemptions": ("Preemptions by the engine's scheduler.", lambda s: s.engine.preemptions_total),
        "vllm:prompt_tokens": ("Prompt tokens processed.", lambda s: s.engine.prompt_tokens_total),
        "vllm:generation_tokens": ("Tokens generated.", lambda s: s.engine.generation_tokens_total),
        "vllm:prefix_cache_queries": (
            "Prompt tokens looked up in the engine's prefix cache.",
            lambda s: s.engine.prefix_cache_queries_total,
        ),
        "vllm:prefix_cache_hits": (
            "Prompt tokens found in the engine's prefix cache (their KV reused, not computed).",
            lambda s: s.engine.prefix_cache_hits_total,
        ),
        "app_refused_queue_full": ("Refused by the replica: queue full.", lambda s: s.admission.refused_queue_full),
        "app_refused_queue_timeout": (
            "Refused by the replica: waited too long.",
            lambda s: s.admission.refused_queue_timeout,
        ),
        "app_refused_over_time_target": (
            "Refused by the replica at arrival: predicted to miss its first-token or end target.",
            lambda s: s.admission.refused_over_time_target,
        ),
        "app_engine_wedged": (
            "Engines the replica declared wedged: no output past the bound of what was in them.",
            lambda s: s.wedged_total,
        ),
        "app_engine_restarts": ("Engines the replica restarted in place.", lambda s: s.restarts_total),
    }

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("app_replica_up", "1 for an engine replica that answered this scrape, 0 for one that "
                               "did not (stopped, or its event loop blocked).", labels=["model_name", "replica"])
        for model, replicas in self._stats.items():
            for replica, s in replicas.items():
                up.add_metric([model, replica], 0 if s is None else 1)
        yield up
        answered = [(model, replica, s) for model, replicas in self._stats.items()
                    for replica, s in replicas.items() if s is not None]
        for name, (doc, read) in self._GAUGES.items():
            family = GaugeMetricFamily(name, doc, labels=["model_name", "replica"])
            for model, replica, s in answered:
                family.add_metric([model, replica], read(s))
            yield family
        for name, (doc, read) in self._COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=["model_name", "replica"])
            for model, replica, s in answered:
                counter.add_metric([model, replica], read(s))
            yield counter
        yield _by_model_and(
            "app_requests_retried",
            "Attempts the ingress made on another replica for a request refused (or lost) before anything was sent, "
            "by the refusal's reason.",
            "reason",
            self._retried,
        )
        yield _by_model_and(
            "app_requests_migrated",
            "Choices resumed on another replica, or on the engine restarted in place, after theirs failed "
            "mid-answer (outcome 'resumed'), "
            "requests that could not continue elsewhere (outcome 'unresumable'), and streams it took out of the "
            "engine while their client did not read (outcome 'paused').",
            "outcome",
            self._migrated,
        )


class _Routing:
    """The fleet router's figures (app/routing/fleet_router.py), per model and replica."""

    _COUNTERS: dict[str, tuple[str, Callable[[ReplicaRouting], float]]] = {
        "app_routed_requests": ("Requests the fleet router sent to the replica.", lambda f: f.routed),
        "app_routed_predicted_cached_tokens": (
            "Prompt tokens the router predicted the replica's prefix cache held (answered requests).",
            lambda f: f.predicted_cached_tokens),
        "app_routed_confirmed_cached_tokens": (
            "Of those, the tokens the engine reported cached: the router's precision is confirmed / predicted.",
            lambda f: f.confirmed_cached_tokens),
        "app_routed_realized_cached_tokens": (
            "Prompt tokens the engine reported cached, on the requests the router sent it.",
            lambda f: f.realized_cached_tokens),
        "app_routed_first_tokens": ("Routed requests whose first output came back.", lambda f: f.first_tokens),
        "app_routed_predicted_first_token_seconds": (
            "Their first tokens as the router predicted them, summed (seconds from sending).",
            lambda f: f.predicted_first_token_s),
        "app_routed_measured_first_token_seconds": (
            "Their first tokens as they came, summed (seconds from sending).", lambda f: f.measured_first_token_s),
    }

    def __init__(self, routing: Mapping[str, FleetFigures]):
        self._routing = routing

    def collect(self) -> Iterable[Metric]:
        for name, (doc, read) in self._COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=["model_name", "replica"])
            for model, figures in self._routing.items():
                for replica, f in figures.replicas.items():
                    counter.add_metric([model, replica], read(f))
            yield counter
        refused = CounterMetricFamily("app_routing_refused_over_time_target", "Requests the fleet router refused "
                                      "at once: even the soonest replica would miss the first-token target.",
                                      labels=["model_name"])
        decision = GaugeMetricFamily("app_routing_decision_p99_seconds", "The fleet router's decision time, 99th "
                                     "percentile over its last 1,024 decisions (NaN: none yet).", labels=["model_name"])
        cpu = GaugeMetricFamily("app_routing_decision_cpu_p99_seconds", "The same on the deciding thread's CPU: the "
                                "router's own work, without waits for a core or the GIL (NaN: none yet).",
                                labels=["model_name"])
        for model, figures in self._routing.items():
            refused.add_metric([model], figures.refused)
            for family, ms in ((decision, figures.decision_p99_ms), (cpu, figures.decision_cpu_p99_ms)):
                family.add_metric([model], float("nan") if ms is None else ms / 1000)
        yield refused
        yield decision
        yield cpu


def _by_model_and(name: str, doc: str, label: str, counts: Mapping[str, Mapping[str, int]]) -> CounterMetricFamily:
    """A counter the ingress keeps per model and one more label (HandleBackend's `retried`, `migrated`)."""
    family = CounterMetricFamily(name, doc, labels=["model_name", label])
    for model, by_value in counts.items():
        for value, count in sorted(by_value.items()):
            family.add_metric([model, value], count)
    return family


class RequestTimer:
    """Latency of one generation request as the client sees it; fed once per chunk."""

    __slots__ = ("_metrics", "_model", "_arrived", "_last", "finished")

    def __init__(self, metrics: Metrics, model: str, arrived: float):
        self._metrics = metrics
        self._model = model
        self._arrived = arrived
        self._last: float | None = None
        self.finished = False

    def token(self, now: float) -> None:
        if self._last is None:
            self._metrics.ttft.labels(self._model).observe(now - self._arrived)
        else:
            self._metrics.itl.labels(self._model).observe(now - self._last)
        self._last = now

    def done(self, now: float) -> None:
        self.finished = True
        self._metrics.e2e.labels(self._model).observe(now - self._arrived)

    def client_left(self, endpoint: str) -> None:
        self._metrics.client_aborts.labels(self._model, endpoint).inc()

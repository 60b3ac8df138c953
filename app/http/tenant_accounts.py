"""TenantAccounts: what this ingress has seen of each tenant, for /stats and /metrics (issue 28).

Per tenant: requests in flight and those of them not yet in an engine (waiting in a replica's admission queue, or
routed there), tokens served (prompt and generated, as the replicas counted them), tokens held now against the
tenant's `tokens_per_minute` (reservations not yet settled: http/tenant_limits.py), refusals by reason and the tokens
the refused requests asked for (their output, n x max_tokens per prompt, and the refused prompt's own tokens where a
replica or the fleet router had counted them before refusing; a refusal before its body was read counts as a request
only: not reading it is what keeps that refusal cheap). Keyed by the tenant's metrics label (configured and key
tenants by name, every client address as `by-address`), so the label set stays bounded. With several ingress replicas
each counts what passes through it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from app.tenancy import Tenant


@dataclass
class Account:
    in_flight: int = 0
    queued: int = 0  # in flight, not yet in an engine
    prompt_tokens: int = 0
    generated_tokens: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # by reason (the error's code)
    refused_tokens: int = 0  # the tokens refused requests asked for (output, and prompt where counted), body read


class TenantAccounts:
    def __init__(self, reserved: Callable[[], Mapping[str, int]] = dict):
        self._accounts: dict[str, Account] = {}
        self._reserved = reserved  # tokens held now against each budget, by tenant name (TenantLimits.reserved)

    def of(self, tenant: Tenant) -> Account:
        return self._accounts.setdefault(tenant.metrics_label, Account())

    def refused(self, tenant: Tenant | None, reason: str, asked_tokens: int = 0) -> None:
        if tenant is not None:
            account = self.of(tenant)
            account.refused[reason] += 1
            account.refused_tokens += asked_tokens

    def as_json(self) -> dict[str, dict[str, object]]:
        reserved = self._reserved()
        return {label: {"in_flight": a.in_flight, "queued": a.queued, "prompt_tokens": a.prompt_tokens,
                        "generated_tokens": a.generated_tokens, "reserved_tokens": reserved.get(label, 0),
                        "refused": dict(a.refused), "refused_tokens": a.refused_tokens}
                for label, a in sorted(self._accounts.items())}

    def collect(self) -> Iterator[Metric]:
        """Prometheus families, for `Metrics.render`'s extra collectors."""
        tokens = CounterMetricFamily("app_tenant_tokens", "Tokens served, by tenant and kind (prompt, generated).",
                                     labels=["tenant", "kind"])
        in_flight = GaugeMetricFamily("app_tenant_requests_in_flight", "Requests in flight through this ingress, "
                                      "by tenant.", labels=["tenant"])
        queued = GaugeMetricFamily("app_tenant_requests_queued", "Requests in flight not yet in an engine (waiting "
                                   "in a replica's admission queue), by tenant.", labels=["tenant"])
        reserved = GaugeMetricFamily("app_tenant_tokens_reserved", "Tokens held now against the tenant's "
                                     "tokens_per_minute by requests not yet ended.", labels=["tenant"])
        refused = CounterMetricFamily("app_tenant_refusals", "Requests refused, by tenant and reason.",
                                      labels=["tenant", "reason"])
        refused_tokens = CounterMetricFamily("app_tenant_refused_tokens", "Tokens asked by requests refused after "
                                             "their body was read (n x max_tokens, plus the prompt's tokens where "
                                             "they were counted before the refusal), by tenant.", labels=["tenant"])
        for label, a in sorted(self._accounts.items()):
            tokens.add_metric([label, "prompt"], a.prompt_tokens)
            tokens.add_metric([label, "generated"], a.generated_tokens)
            in_flight.add_metric([label], a.in_flight)
            queued.add_metric([label], a.queued)
            for reason, count in sorted(a.refused.items()):
                refused.add_metric([label, reason], count)
            if a.refused:
                refused_tokens.add_metric([label], a.refused_tokens)
        for label, held in sorted(self._reserved().items()):
            reserved.add_metric([label], held)
        yield from (tokens, in_flight, queued, reserved, refused, refused_tokens)

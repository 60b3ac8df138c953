"""Capacity: the generation requests this ingress has in flight per model and tenant, against what the model's
replicas can hold, so a full service refuses before reading a body (http/gate.py asks); and, through `track`, each
request's tokens into its tenant's budget (tenant_limits.py) and account (tenant_accounts.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncGenerator, Callable
from typing import Any

from app.config.app_config import AppConfig
from app.engine.interface import Admitted, Embeddings, GenerationDelta
from app.errors import ServiceError, queue_full_class
from app.http.tenant_accounts import TenantAccounts
from app.http.tenant_limits import Reservation, TenantLimits
from app.tenancy import Tenant


class Capacity:
    """What this ingress has in flight per model, against what the model's replicas can hold at most
    (replicas x (max_ongoing + max_queued)). Past that, the replicas would refuse anyway: refusing
    here costs no Ray call, so a refusal stays cheap when it matters most, under overload. The
    replicas' own admission remains the authority (with several ingress replicas this is per ingress).

    Per tenant (app/tenancy.py): a full model still lets through a tenant holding less than an even share of it,
    whose request then takes the place of a more served tenant's at the replica (app/host/fair_queue.py); so one
    tenant filling the service cannot lock the others out here."""

    def __init__(self, config: AppConfig, retry_after: Callable[[str], float] = lambda model_id: 1.0):
        self.retry_after = retry_after  # when a place frees on a model's replicas, as they predict it
        self.limit = {
            m.id: m.deployment.num_replicas * (m.deployment.max_ongoing_requests + m.deployment.max_queued_requests)
            for m in config.models
        }
        self.inflight = {m.id: 0 for m in config.models}
        self.held: dict[str, Counter[str]] = {m.id: Counter() for m in config.models}  # per model, by tenant
        self.limits = TenantLimits(config.tenants)
        self.accounts = TenantAccounts(self.limits.reserved)
        self._refusal = queue_full_class(config.service.refusal_status)

    def _full_for(self, model_id: str, tenant: Tenant) -> bool:
        if self.inflight[model_id] < self.limit[model_id]:
            return False
        held = self.held[model_id]
        return held[tenant.name] >= self.limit[model_id] / (len(held) + (tenant.name not in held))

    def refusal_if_all_full(self, tenant: Tenant) -> ServiceError | None:
        """Every model at capacity for `tenant`: any generation request of its would be refused, whatever its body."""
        if all(self._full_for(m, tenant) for m in self.limit):
            return self._refusal("Server is at capacity; retry after the Retry-After delay, with backoff",
                                 retry_after_s=min(self.retry_after(m) for m in self.limit))
        return None

    async def track(self, model_id: str, stream: AsyncGenerator[Any, None], tenant: Tenant,
                    reservation: Reservation | None = None) -> AsyncGenerator[Any, None]:
        """`stream`, counted from its first `anext` until it is closed, however that happens: by the
        end of the stream, an error, the client leaving, or garbage collection of a body never sent. Its tokens
        (prompt and generated) settle `reservation` at that end."""
        used = 0
        if self._full_for(model_id, tenant):
            if reservation is not None:
                reservation.cancel()
            await stream.aclose()
            raise self._refusal(
                f"Server is at capacity for '{model_id}' ({self.limit[model_id]} requests running or queued); "
                "retry after the Retry-After delay, with backoff", retry_after_s=self.retry_after(model_id))
        self.inflight[model_id] += 1
        self.held[model_id][tenant.name] += 1
        account, queued = self.accounts.of(tenant), True
        account.in_flight += 1
        account.queued += 1
        try:
            async for item in stream:
                prompt, generated = _tokens_of(item)
                used += prompt + generated
                account.prompt_tokens += prompt
                account.generated_tokens += generated
                if queued and isinstance(item, (Admitted, GenerationDelta, Embeddings)):
                    queued, account.queued = False, account.queued - 1
                yield item
        finally:
            if reservation is not None:
                reservation.settle(used)
            account.in_flight -= 1
            account.queued -= queued
            self.inflight[model_id] -= 1
            held = self.held[model_id]
            held[tenant.name] -= 1
            if held[tenant.name] <= 0:
                del held[tenant.name]
            await stream.aclose()


def _tokens_of(item: object) -> tuple[int, int]:
    """(prompt, generated) tokens an item of a replica's stream accounts for."""
    if isinstance(item, (Admitted, Embeddings)):
        return item.prompt_tokens, 0
    if isinstance(item, GenerationDelta):
        return 0, sum(c.num_tokens for c in item.choices)
    return 0, 0

"""Who sent a request: the tenant named by its API key (`tenants:` in the config), each `service.api_keys` key a tenant
of its own, or, with no key configured at all, the client's address. Resolved once per request at the front door;
the `Tenant` (never the key) travels with the request to the replica, whose admission shares its queue fairly between
tenants (app/host/fair_queue.py). A configured tenant's prompts keep their prefix-cache blocks to themselves unless it
shares them (`cache_salt`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.api_keys import ApiKeys, raw_digest

if TYPE_CHECKING:
    from app.config.app_config import AppConfig

ADDRESS_PREFIX = "addr:"  # tenants by client address; /metrics counts them under one label, `by-address`


@dataclass(frozen=True)
class Tenant:
    name: str = "anonymous"
    weight: float = 1.0
    batch: bool = False  # priority class: batch waits behind interactive, and is refused first
    own_cache: bool = False  # its prompts' prefix-cache blocks kept apart from every other tenant's (`cache_salt`)

    @property
    def metrics_label(self) -> str:
        """A bounded label: configured tenants and keys by name, every client address as one."""
        return "by-address" if self.name.startswith(ADDRESS_PREFIX) else self.name


ANONYMOUS = Tenant()  # requests made inside the service (tests, probes) and engines hosted in-process
BATCH_PRIORITY = 2**32  # the batch class's engine priority (lower first): after any interactive request's own


def engine_priority(tenant: Tenant, asked: int) -> int:
    """The engine's scheduling priority (vLLM's, lower first; `engine.scheduling_policy: priority`) of a request of
    `tenant` that asked for `asked`: a batch tenant's after every interactive one's, the client's own value ordering
    requests only within its class."""
    return (BATCH_PRIORITY if tenant.batch else 0) + max(-(2**31), min(2**31 - 1, asked))


def cache_salt(tenant: Tenant | None, salt: str | None) -> str | None:
    """The prefix-cache salt a request of `tenant` runs with, `salt` the client's own: led by the tenant's mark when it
    keeps its cache to itself. The mark holds a '/', which no client's salt may (vLLM's rule, openai/sampling_bounds),
    so no salt any client sends is, or leads to, a tenant's."""
    if tenant is None or not tenant.own_cache:
        return salt
    mark = "tenant/" + hashlib.sha256(tenant.name.encode()).hexdigest()[:16]
    return mark if salt is None else f"{mark}/{salt}"


def key_tenant_name(digest_hex: str) -> str:
    """A `service.api_keys` key's own tenant: named by its digest's start, which holds no secret."""
    return f"key-{digest_hex[:8]}"


class Tenants:
    """The key -> tenant directory of one config, and the accepted keys with it."""

    def __init__(self, config: AppConfig):
        by_digest = {raw_digest(entry): Tenant(key_tenant_name(raw_digest(entry).hex()))
                     for entry in config.service.api_keys}
        for t in config.tenants:
            tenant = Tenant(t.name, t.weight, t.priority == "batch", own_cache=not t.share_prefix_cache)
            by_digest.update((raw_digest(entry), tenant) for entry in t.api_keys)
        self._by_digest = by_digest
        self.keys = ApiKeys(frozenset(by_digest))

    def of(self, authorization: bytes, client_host: str | None) -> Tenant | None:
        """The request's tenant; None when keys are configured and it carries none of them (a 401)."""
        if not self.keys:
            return Tenant(f"{ADDRESS_PREFIX}{client_host or 'unknown'}")
        digest = self.keys.match(authorization)
        return None if digest is None else self._by_digest[digest]

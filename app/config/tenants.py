"""Tenants: who shares the service, and on what terms (`tenants:` at the top of the file; docs/tenants.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from app.api_keys import check_entry
from app.config.common import StrictModel


class TenantConfig(StrictModel):
    """One tenant: its keys, and its share of every replica when replicas are contended."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                      description="Shown in logs, /stats and /metrics; letters, digits, '_', '.', '-'.")
    api_keys: tuple[str, ...] = Field(..., min_length=1,
                                      description="The tenant's bearer keys, plain or `sha256:<64 hex digits>`.")
    weight: float = Field(1.0, gt=0, le=1000,
                          description="Share of a contended replica, relative to the other tenants' weights.")
    priority: Literal["interactive", "batch"] = Field(
        "interactive", description="'batch' waits behind every interactive request and is the first refused.")

    share_prefix_cache: bool = Field(
        False, description="Whether its prompts share the engines' prefix cache with the other tenants that share "
        "it. false: its cached prompts are its own (vLLM's cache_salt), so no other tenant can tell by timing what it "
        "sent; true: a system prompt common to tenants is computed once for them all.")
    max_concurrent: int | None = Field(None, ge=1, description="Requests in flight at once; more get "
                                       "`429 tenant_rate_limited`. Per ingress replica.")
    requests_per_minute: int | None = Field(None, ge=1, description="Requests let in over any 60 s; more get "
                                            "`429 tenant_rate_limited`. Per ingress replica.")
    tokens_per_minute: int | None = Field(
        None, ge=1, description="Tokens over any 60 s, reserved before any work for the most a request can cost "
        "(its prompt's bound plus n x max_tokens) and settled to its real usage at its end, so a burst cannot overrun "
        "it. Per ingress replica.")

    @field_validator("api_keys")
    @classmethod
    def _digests_well_formed(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(map(check_entry, keys))

"""TenantLimits: each tenant's `max_concurrent`, `requests_per_minute` and `tokens_per_minute` (config `tenants:`),
enforced at the front door before any work, with token budgets that a burst cannot overrun.

Tokens are reserved when a request is let in, for the most it can cost: its prompt's bound (`prompt_token_bound`: at
most one token per byte of text, byte-level tokenizers never do worse) plus every choice's `max_tokens`. At its end,
however it ends, the reservation is settled to what it really used (the replica's count of prompt and generated
tokens). So concurrent requests each see the others' reservations, and the sum over the last 60 s never passes the
budget, not even by one request. Windows slide over the last 60 s; a refusal's Retry-After is when enough of the
window has passed, or sooner when the requests in flight, ending as the tenant's requests usually do (how long they
take, what share of their reservation they use), would give back enough. Per ingress replica (each counts what passes
through it).
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from app.config.tenants import TenantConfig
from app.engine.interface import PromptInput
from app.errors import TenantRateLimited
from app.tenancy import Tenant

WINDOW_S = 60.0
TEMPLATE_TOKENS_PER_MESSAGE = 16  # what a chat template may add around each message (roles, separators)


def prompt_token_bound(prompt: PromptInput) -> int:
    """The most tokens `prompt` can render to, without tokenizing."""
    if prompt.token_ids is not None:
        return len(prompt.token_ids)
    if prompt.text is not None:
        return _bytes(prompt.text)
    size = sum(_bytes(json.dumps(m, ensure_ascii=False)) + TEMPLATE_TOKENS_PER_MESSAGE for m in prompt.messages or ())
    return size + _bytes(json.dumps(prompt.tools or (), ensure_ascii=False))


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))  # a lone surrogate is the replica's 400 to give, not a crash


class _Holds:
    """A tenant's reservations not yet settled, and how its settled ones went (moving averages of how long each was
    held and what share of it was used), for a refusal's Retry-After."""

    __slots__ = ("open", "hold_s", "used_share")

    def __init__(self) -> None:
        self.open = 0  # tokens reserved by requests not yet ended
        self.hold_s: float | None = None  # None: none settled yet
        self.used_share = 1.0

    def settled(self, reserved: int, used: int, held_s: float) -> None:
        self.open -= reserved
        share = min(used, reserved) / reserved if reserved else 1.0
        first = self.hold_s is None
        self.hold_s = held_s if self.hold_s is None else 0.8 * self.hold_s + 0.2 * held_s
        self.used_share = share if first else 0.8 * self.used_share + 0.2 * share

    def room_in_s(self, excess: float) -> float | None:
        """When the requests in flight, ending as they usually do, give back `excess` tokens (None: they would not)."""
        if self.hold_s is None or self.open * (1.0 - self.used_share) < excess:
            return None
        return max(1.0, self.hold_s)


class Reservation:
    """Tokens held in a tenant's window for one request; `settle` sets them to what it used (the first settle ends
    the hold)."""

    __slots__ = ("_entry", "_holds", "_clock", "_since")
    _holds: _Holds | None

    def __init__(self, entry: list[float], holds: _Holds, clock: Callable[[], float]):
        self._entry, self._holds, self._clock, self._since = entry, holds, clock, clock()
        holds.open += int(entry[1])

    def settle(self, used: int) -> None:
        if self._holds is not None:
            self._holds.settled(int(self._entry[1]), used, self._clock() - self._since)
            self._holds = None
        self._entry[1] = min(self._entry[1], used)

    def cancel(self) -> None:
        """Give it all back: the request was refused before it ran (it teaches nothing of how requests end)."""
        if self._holds is not None:
            self._holds.open -= int(self._entry[1])
            self._holds = None
        self._entry[1] = 0


class _Window:
    """Amounts over the last WINDOW_S seconds: [when, amount] entries, oldest first."""

    def __init__(self) -> None:
        self.entries: deque[list[float]] = deque()

    def total(self, now: float) -> float:
        while self.entries and self.entries[0][0] <= now - WINDOW_S:
            self.entries.popleft()
        return sum(e[1] for e in self.entries)

    def wait_for_room(self, now: float, limit: float, amount: float) -> float:
        """Seconds until `amount` more fits under `limit` (inf: it never fits)."""
        if amount > limit:
            return math.inf
        excess = self.total(now) + amount - limit
        for when, held in self.entries:
            if excess <= 0:
                break
            excess -= held
            if excess <= 0:
                return max(1.0, when + WINDOW_S - now)
        return 1.0

    def add(self, now: float, amount: float) -> list[float]:
        entry = [now, amount]
        self.entries.append(entry)
        return entry


class TenantLimits:
    def __init__(self, tenants: Iterable[TenantConfig], clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._config = {t.name: t for t in tenants if t.max_concurrent or t.requests_per_minute or t.tokens_per_minute}
        self._requests: dict[str, _Window] = {name: _Window() for name in self._config}
        self._tokens: dict[str, _Window] = {name: _Window() for name in self._config}
        self._concurrent: dict[str, int] = dict.fromkeys(self._config, 0)
        self._holds = {name: _Holds() for name in self._config}

    def reserved(self) -> dict[str, int]:
        """Tokens held now by requests not yet ended, by tenant (those with a token budget)."""
        return {name: self._holds[name].open for name, config in self._config.items() if config.tokens_per_minute}

    def limited(self, tenant: Tenant) -> bool:
        return tenant.name in self._config

    def admit_request(self, tenant: Tenant) -> None:
        """Before the body is read: the tenant's concurrency and request rate. Counts the request if let in; the
        caller calls `done` when it ends."""
        config = self._config.get(tenant.name)
        if config is None:
            return
        now = self._clock()
        if config.max_concurrent and self._concurrent[tenant.name] >= config.max_concurrent:
            raise TenantRateLimited(f"Tenant '{tenant.name}' has {config.max_concurrent} requests in flight, its "
                                    "max_concurrent; retry when one ends", retry_after_s=1)
        window = self._requests[tenant.name]
        if config.requests_per_minute and window.total(now) >= config.requests_per_minute:
            wait = window.wait_for_room(now, config.requests_per_minute, 1)
            raise TenantRateLimited(f"Tenant '{tenant.name}' has sent {config.requests_per_minute} requests in the "
                                    "last minute, its requests_per_minute; retry after the Retry-After delay",
                                    retry_after_s=wait)
        window.add(now, 1)
        self._concurrent[tenant.name] += 1

    def done(self, tenant: Tenant) -> None:
        if tenant.name in self._concurrent:
            self._concurrent[tenant.name] -= 1

    def reserve_tokens(self, tenant: Tenant, tokens: int) -> Reservation | None:
        """`tokens` (the request's most) held in the tenant's minute, or `TenantRateLimited` if they do not fit."""
        config = self._config.get(tenant.name)
        if config is None or not config.tokens_per_minute:
            return None
        now, window, limit = self._clock(), self._tokens[tenant.name], config.tokens_per_minute
        if window.total(now) + tokens > limit:
            wait = window.wait_for_room(now, limit, tokens)
            if math.isinf(wait):
                raise TenantRateLimited(
                    f"This request may cost up to {tokens} tokens (its prompt's bound plus n x max_tokens), more "
                    f"than the tokens_per_minute ({limit}) of tenant '{tenant.name}'; lower max_tokens or the prompt",
                    param="max_tokens")
            # Sooner where the requests in flight give back what they reserved and will not use.
            if (sooner := self._holds[tenant.name].room_in_s(window.total(now) + tokens - limit)) is not None:
                wait = min(wait, sooner)
            raise TenantRateLimited(
                f"Tenant '{tenant.name}' would pass its tokens_per_minute ({limit}) with this request's up to {tokens} "
                "tokens; retry after the Retry-After delay", retry_after_s=wait)
        return Reservation(window.add(now, tokens), self._holds[tenant.name], self._clock)

    def reserve_together(self, tenant: Tenant, prompts: Sequence[PromptInput]) -> Reservation | None:
        """One reservation for every prompt of a request admitted whole (embeddings' inputs)."""
        config = self._config.get(tenant.name)
        if config is None or not config.tokens_per_minute:
            return None
        return self.reserve_tokens(tenant, sum(map(prompt_token_bound, prompts)))

    def reserve_each(self, tenant: Tenant, prompts: Sequence[PromptInput],
                     outputs: int = 0) -> list[Reservation | None]:
        """One reservation per prompt of a batch, for its bound plus `outputs` (n x max_tokens); all or none (those
        made are given back on a refusal). Nothing is computed for a tenant without a token budget."""
        config = self._config.get(tenant.name)
        if config is None or not config.tokens_per_minute:
            return [None] * len(prompts)
        made: list[Reservation | None] = []
        try:
            for prompt in prompts:
                made.append(self.reserve_tokens(tenant, prompt_token_bound(prompt) + outputs))
        except TenantRateLimited:
            for reservation in made:
                if reservation is not None:
                    reservation.cancel()
            raise
        return made

"""Slots: a replica's requests in the engine, and which of them gives its slot to a waiting one of another tenant.

The admission (app/host/admission.py) decides who takes a slot; this holds who has one. The fair queue orders who
waits (app/host/fair_queue.py); without this, a tenant whose long streams hold every slot keeps them until each ends
(a minute at 1,024 tokens on the CPU; docs/tenants.md), and a light tenant arriving then waits that long, or is refused
by time, however fair the queue. So when the next waiting request cannot start, the newest pausable running request of
the tenant holding the most slots per weight is asked to yield, if that tenant would still hold more than the waiting
one's with the slot and has been served at least as much (the fair queue's counters; batch yields to interactive
whatever was served). Both: slots alone let a tenant of short, prefill-heavy requests take a slot from long streams
at every arrival while already served more (s4 in docs/tenants.md: 65 % of the service and 0.69x the output);
counters alone would let a newcomer preempt until it held every slot. One tenant never preempts itself, so a lone
tenant runs first come, first served as before. The request asked pauses at its next output and resumes in place when
its turn comes again (app/host/pauses.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from typing import Generic, Protocol, TypeVar

from app.tenancy import Tenant


class Running(Protocol):
    tenant: Tenant
    started: float
    pausable: bool  # its host can pause and resume it (app/host/pauses.py)
    last_output: float
    resuming: bool  # back from a pause, its first output since not yet come (the engine prefills it again)
    prompt_tokens: int
    tokens: int  # prompt + every choice's max_tokens: what it holds of the token budget

    @property
    def choices(self) -> int: ...  # n (0 for an embedding): the engine sequences it runs
    yield_asked: bool


R = TypeVar("R", bound=Running)


def claim(tenant: Tenant, slots: int) -> tuple[bool, float]:
    """How strongly `tenant` holds `slots`: batch above interactive, then slots per weight."""
    return tenant.batch, slots / tenant.weight


Served = Callable[[Tenant], float]  # a tenant's service so far (the fair queue's counter)


def to_yield(running: Collection[R], waiting: Tenant, waiting_served: float = 0.0,
             served: Served = lambda tenant: 0.0) -> R | None:
    """The running request to pause so that `waiting`'s next request (its tenant served `waiting_served`) starts."""
    held = Counter(r.tenant.name for r in running)
    theirs = claim(waiting, held[waiting.name] + 1)

    def gives_way(r: R) -> bool:
        return (r.pausable and claim(r.tenant, held[r.tenant.name]) > theirs
                and (r.tenant.batch > waiting.batch or served(r.tenant) >= waiting_served))

    # Among the most strongly held tenant's, the newest with output (one still in prefill notices only at its first).
    return max(filter(gives_way, running), default=None,
               key=lambda r: (claim(r.tenant, held[r.tenant.name]), r.last_output > 0, r.started))


class Slots(Generic[R]):
    """The requests in the engine, the tokens they hold, and the one asked to yield (at most one at a time)."""

    def __init__(self, served: Served = lambda tenant: 0.0, by_class: bool = False) -> None:
        self.served = served
        self.by_class = by_class  # the engine prefills interactive prompts first (vLLM's priority scheduling)
        self.held: set[R] = set()
        self.tokens_in_use = 0
        self.seqs = 0  # engine sequences: every choice of every request held
        self.yielding: R | None = None
        self.prefilled_at = 0.0  # the last first output (or first after a resume): a prompt's prefill ended then

    def __len__(self) -> int:
        return len(self.held)

    def room_for(self, item: R, max_running: int, token_budget: int) -> bool:
        """Sequences free for `item`'s choices and its tokens within the budget; anything fits an empty engine
        (nothing is refused for ever). Sequences, not requests: vLLM runs each choice of a request as a sequence of
        its own and `max_num_seqs` bounds those, so four requests of n 4 fill 16 of its places (a request admitted
        past them would wait inside the engine, where it can neither be seen nor paused)."""
        if not self.held:
            return True
        return (self.seqs + max(1, item.choices) <= max_running
                and self.tokens_in_use + item.tokens <= token_budget)

    def take(self, item: R) -> None:
        self.held.add(item)
        self.tokens_in_use += item.tokens
        self.seqs += max(1, item.choices)

    def give_back(self, item: R) -> None:
        if self.yielding is item:
            self.yielding = None
        self.held.discard(item)
        self.tokens_in_use -= item.tokens
        self.seqs -= max(1, item.choices)

    def produced(self, item: R, now: float) -> None:
        """`item` had an output at `now`."""
        if not item.last_output or item.resuming:
            self.prefilled_at = now
        item.last_output, item.resuming = now, False

    def prefilling(self, since: float, now: float) -> bool:
        """Whether the engine prefilled a prompt between `since` and `now` (a stream's last output and this one): one
        held has had no output yet (or none since its resume), or one had its first in the step ending now. The
        outputs of one step come one after another: a first output in the earlier half of the time belongs to the
        step that ended at `since`."""
        return self.prefilled_at > (since + now) / 2 or any(not r.last_output or r.resuming for r in self.held)

    def ask_to_yield(self, waiting: Tenant, waiting_served: float) -> None:
        """Asks one running request to pause for `waiting`'s, unless one already has been."""
        if self.yielding is None:
            self.yielding = to_yield(self.held, waiting, waiting_served, self.served)
            if self.yielding is not None:
                self.yielding.yield_asked = True

    def prefills_after(self, item: R, newcomer: Tenant) -> bool:
        """Whether the engine takes `newcomer`'s prompt before `item`'s (if not prefilled yet): a batch one's waits."""
        return self.by_class and item.tenant.batch > newcomer.batch

    def prefill_before(self, item: R) -> int:
        """The prompt tokens the engine prefills before `item`'s first output, its own included (held, no output)."""
        return sum(r.prompt_tokens for r in self.held if not r.last_output and not self.prefills_after(r, item.tenant))

    def given_way(self, waiting: Collection[R]) -> set[R]:
        """Those of `waiting` a running request would give its slot to (their counters as they stand; one look per
        tenant: the queue's sweep asks this of every waiting request)."""
        tenants = {r.tenant for r in waiting}
        yes = {t for t in tenants if to_yield(self.held, t, self.served(t), self.served) is not None}
        return {r for r in waiting if r.tenant in yes}

    def for_newcomer(self, tenant: Tenant, served: float) -> list[R]:
        """The running requests a newcomer of `tenant` is predicted behind: not the one that will yield to it."""
        victim = self.yielding or to_yield(self.held, tenant, served, self.served)
        return [r for r in self.held if r is not victim]

"""FairQueue: a replica's waiting requests, served fairly between tenants by the tokens each has been served.

Virtual token counters (VTC, "Fairness in Serving Large Language Models", OSDI '24): each tenant's counter is the
service it has had here, in weighted tokens (prompt 1, each generated token 2, as VTC weighs them) divided by its
weight. The next request admitted is the head of the waiting tenant with the lowest counter. A request that arrives
while its tenant has nothing waiting lifts that tenant's counter to the lowest of the tenants that wait (none
waiting: to the counter of the tenant admitted last), as VTC does: a tenant earns no credit while it is not
backlogged, not even while its earlier requests run, so it cannot later spend credit starving the others (measured:
lifting only tenants with nothing in the system let long streams starve a backlogged tenant for 30 s, docs/tenants.md).
A tenant refused while it has anything in the system is backlogged too, though nothing of its waits: VTC never
refuses, and here refusals by time keep a tenant out of the queue, so lifting it would take from it the service it
was refused (measured: lifting it at each admitted arrival gave the other tenant 65 % of the service in s4).
Within a tenant, arrival order. A lone tenant gets the whole replica: the queue is work-conserving. The `batch`
priority class waits behind every interactive tenant.

When the replica is full, `over_share` names the waiting request to refuse so that a newcomer can have its place: the
newest of the tenant holding the most places per weight (batch first), if it would still hold more than the newcomer's
tenant with that place. Places, not counters: a newcomer's counter starts at the others', yet it holds nothing. With
one tenant nothing changes: first come, first served, and refused when full.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from app.tenancy import Tenant

OUTPUT_WEIGHT = 2.0  # a generated token costs twice a prompt token (VTC's weighting)
REMEMBERED = 4096  # counters kept of tenants with nothing in the system (only those above the lowest matter)


class Waiting(Protocol):
    tenant: Tenant
    prompt_tokens: int
    tokens: int  # prompt + every choice's max_tokens
    paused: bool  # a running request paused for another tenant: first of its tenant's, never displaced


W = TypeVar("W", bound=Waiting)


def _cost(item: Waiting) -> float:
    """What serving `item` whole adds to its tenant's counter."""
    return (item.prompt_tokens + OUTPUT_WEIGHT * (item.tokens - item.prompt_tokens)) / item.tenant.weight


class FairQueue(Generic[W]):
    def __init__(self) -> None:
        self._queues: dict[str, deque[W]] = {}
        self._counter: dict[str, float] = {}
        self._in_system: Counter[str] = Counter()
        self._turn: dict[str, int] = {}  # when each tenant in the system last had a request admitted
        self._turns = 0
        self._last_started = ""  # the tenant admitted last: the floor while nobody waits
        self._wanting: set[str] = set()  # tenants refused while in the system: backlogged, never lifted
        self._len = 0

    # -- tenants in the system ---------------------------------------------

    def entered(self, tenant: Tenant) -> None:
        """A request of `tenant` holds a place in the system (reserved, waiting or running)."""
        self._in_system[tenant.name] += 1

    def arrived(self, tenant: Tenant) -> None:
        """A request of `tenant` is about to wait or start: a tenant with nothing waiting is lifted to the floor."""
        if tenant.name not in self._queues and tenant.name not in self._wanting:
            self._counter[tenant.name] = self._lifted(tenant.name)

    def refused(self, tenant: Tenant) -> None:
        """A request of `tenant` refused for want of room or time: the tenant still wants service (backlogged from
        here as if it waited: lifted now if it was not already), while it holds anything in the system."""
        if self._in_system[tenant.name]:
            self.arrived(tenant)
            self._wanting.add(tenant.name)

    def left(self, tenant: Tenant) -> None:
        self._in_system[tenant.name] -= 1
        if self._in_system[tenant.name] <= 0:
            del self._in_system[tenant.name]
            self._turn.pop(tenant.name, None)
            self._wanting.discard(tenant.name)
            if not self._in_system:
                self._counter.clear()  # nobody to be fair against: the next contention starts even
                self._turns, self._last_started = 0, ""
            elif tenant.name != self._last_started and (self._counter.get(tenant.name, 0.0) <= self._floor()
                                                        or len(self._counter) > REMEMBERED):
                self._counter.pop(tenant.name, None)  # it would be lifted to the floor on return anyway

    def started(self, tenant: Tenant, prompt_tokens: int) -> None:
        """A request of `tenant` admitted to the engine: its prompt charged, its turn taken."""
        self._turns += 1
        self._turn[tenant.name] = self._turns
        self._last_started = tenant.name
        self.charge(tenant, prompt_tokens=prompt_tokens)

    def charge(self, tenant: Tenant, prompt_tokens: int = 0, generated: int = 0) -> None:
        """Service given to `tenant`: a prompt prefilled, or tokens generated (over every choice)."""
        self._counter[tenant.name] = (self._counter.get(tenant.name, self._floor())
                                      + (prompt_tokens + OUTPUT_WEIGHT * generated) / tenant.weight)

    def served(self, tenant: Tenant) -> float:
        """`tenant`'s counter as it stands (0 for one unknown here)."""
        return self._counter.get(tenant.name, 0.0)

    def counter(self, tenant: Tenant) -> float:
        """`tenant`'s counter as its next request would find it (lifted if it has nothing waiting)."""
        backlogged = tenant.name in self._queues or tenant.name in self._wanting
        return self._counter.get(tenant.name, 0.0) if backlogged else self._lifted(tenant.name)

    def _floor(self) -> float:
        if self._queues:
            return min(self._counter.get(t, 0.0) for t in self._queues)
        return self._counter.get(self._last_started, 0.0)

    def _lifted(self, name: str) -> float:
        return max(self._counter.get(name, 0.0), self._floor())

    # -- the queue ---------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def append(self, item: W) -> None:
        self._queues.setdefault(item.tenant.name, deque()).append(item)
        self._len += 1

    def push_front(self, item: W) -> None:
        """`item` first of its tenant's (a request paused mid-answer goes on before its tenant's newer ones)."""
        self._queues.setdefault(item.tenant.name, deque()).appendleft(item)
        self._len += 1

    def remove(self, item: W, refused: bool = False) -> None:
        if refused:
            self.refused(item.tenant)
        queue = self._queues[item.tenant.name]
        queue.remove(item)
        self._len -= 1
        if not queue:
            del self._queues[item.tenant.name]

    def head(self) -> W | None:
        """The next to admit: the head of the least served waiting tenant, interactive before batch; between equals
        (a newcomer starts level with the others) the one whose turn was longest ago."""
        def rank(queue: deque[W]) -> tuple[bool, float, int]:
            tenant = queue[0].tenant
            return tenant.batch, self._counter.get(tenant.name, 0.0), self._turn.get(tenant.name, -1)

        best = min(self._queues.values(), default=None, key=rank)
        return best[0] if best is not None else None

    def pop_head(self) -> W:
        item = self.head()
        assert item is not None, "pop_head of an empty queue"
        self.remove(item)
        return item

    def __iter__(self) -> Iterator[W]:
        """Every waiting request in the order it is expected to be admitted (for the pace's predictions): each
        tenant's requests in turn by its counter as if each were served whole when admitted."""
        return iter([item for _, item in self._order()])

    def ahead_of(self, newcomer: Tenant) -> list[W]:
        """The waiting requests expected to be admitted before one more of `newcomer`'s: what it waits behind."""
        own = self._queues.get(newcomer.name, ())
        key = (newcomer.batch, self.counter(newcomer) + sum(map(_cost, own)), len(own))
        return [item for rank, item in self._order() if rank < key]

    def _order(self) -> list[tuple[tuple[bool, float, int], W]]:
        order = []
        for name, queue in self._queues.items():
            virtual = self._counter.get(name, 0.0)
            for position, item in enumerate(queue):
                order.append(((item.tenant.batch, virtual, position), item))
                virtual += _cost(item)
        return sorted(order, key=lambda entry: entry[0])

    def over_share(self, newcomer: Tenant) -> W | None:
        """The waiting request to refuse in favour of `newcomer` when the replica is full: the newest one of the
        waiting tenant holding the most places per weight (batch first), if it holds more than the newcomer's tenant
        would with one more; else None."""
        def claim(tenant: Tenant, more: int = 0) -> tuple[bool, float]:
            return tenant.batch, (self._in_system[tenant.name] + more) / tenant.weight

        newest = [q[-1] for q in self._queues.values() if not q[-1].paused]  # paused ones come first in theirs
        if not newest:
            return None
        victim = max(newest, key=lambda item: claim(item.tenant))
        return victim if claim(victim.tenant) > claim(newcomer, 1) else None

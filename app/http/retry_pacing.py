"""RetryPacing: a connection that comes back before the Retry-After it was given waits it out at the door.

A refusal tells its client when to come back (`Retry-After`). Badly written clients and scripts retry at once, in a
loop; each retry then costs the service a parse, a render, a tokenize and a refusal, on the event loop that also
carries the engine's outputs (the refusal storm of issue 28: 48 such clients took the engine from about 236 output
tokens/s to 30). So the front door remembers, per TCP connection, until when its last refusal asked it to wait, and
a request that arrives on that connection earlier sleeps until then before anything else is done with it: an idle
coroutine, no CPU, and its client sees the pace it was asked to keep. Then it is served or refused as any other.
A held request is let in earlier when the service has room for it now (`room`, asked at most once per
`EARLY_LOOK_S`, and one held request let in per look, so a crowd held together does not come back at once): a
Retry-After is a prediction, and one made while a flood of non-readers held every slot was 60 s where room came in
10 (measured: the hostile scenario's polite client, held 10 s after its first refusal, docs/tenants.md).

Per connection and tenant (the client's address and port, and who it is), not per tenant or address alone: a burst
of first requests on many connections is refused at once, each once (the 240-burst's refusals stay fast), a polite
client beside a storm on the same address is never held for another's refusals, and behind a proxy that carries
many clients over one connection, another tenant's requests on it are not held either. Bounded: at most `MAX_HOLD_S`
per request, and entries are forgotten once their time has passed (at most `MAX_CONNECTIONS` remembered).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

MAX_HOLD_S = 10.0  # within the body clock (30 s): a held request still reads its body in time
EARLY_LOOK_S = 0.25  # how often the held requests look for room, together; one of them let in per look
MAX_CONNECTIONS = 4096
PACED_STATUSES = frozenset({429, 503})

Connection = tuple[str, int, str]  # the client's address and port, and its tenant's name


class RetryPacing:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._not_before: dict[Connection, float] = {}
        self._looked_at = float("-inf")  # the last look for room, by any held request

    def hold_s(self, connection: Connection | None) -> float:
        """How long a request now arriving on `connection` waits before it is looked at (0: not at all)."""
        if connection is None:
            return 0.0
        until = self._not_before.get(connection)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._not_before[connection]
            return 0.0
        return min(left, MAX_HOLD_S)

    async def hold(self, connection: Connection | None, room: Callable[[], bool] | None = None) -> bool:
        """Waits while a request now arriving on `connection` is held: until its Retry-After (at most `MAX_HOLD_S`),
        or until `room()` says the service would take a request now and no other held one was let in at that look.
        Returns whether it was held at all."""
        hold_s = self.hold_s(connection)
        if hold_s <= 0:
            return False
        until = self._clock() + hold_s
        while (left := until - self._clock()) > 0:
            await asyncio.sleep(min(left, EARLY_LOOK_S))
            if room is not None and self._let_in_early(room):
                break
        return True

    def _let_in_early(self, room: Callable[[], bool]) -> bool:
        """One look for room per `EARLY_LOOK_S` over every held request: the one that makes it is let in if there is."""
        now = self._clock()
        if now - self._looked_at < EARLY_LOOK_S:
            return False
        self._looked_at = now
        return room()

    def answered(self, connection: Connection | None, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """A response starts on `connection`: a refusal with a Retry-After sets when it may come back; anything
        else clears it."""
        if connection is None:
            return
        retry_after = _retry_after_s(headers) if status in PACED_STATUSES else None
        if retry_after is None:
            self._not_before.pop(connection, None)
            return
        if len(self._not_before) >= MAX_CONNECTIONS:
            self._forget_passed()
        if len(self._not_before) < MAX_CONNECTIONS:
            self._not_before[connection] = self._clock() + retry_after

    def _forget_passed(self) -> None:
        now = self._clock()
        for connection in [c for c, until in self._not_before.items() if until <= now]:
            del self._not_before[connection]


def _retry_after_s(headers: Iterable[tuple[bytes, bytes]]) -> float | None:
    for name, value in headers:
        if name.lower() == b"retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None

"""Per-replica admission: a bounded FIFO in front of the engine.

At most `max_running` requests, holding at most `token_budget` tokens
(prompt + n * max_tokens) between them, are in the engine at once; up to
`max_queued` more wait in arrival order; anything beyond is refused at once.
The budget keeps a burst of long requests waiting here instead of making the
engine preempt and recompute; a request bigger than the whole budget still runs,
alone, so nothing valid is refused for ever.

Use: `ticket = admission.reserve()` (cheap; raises before any work), validate,
`await ticket.admit(tokens, timeout_s)`, run, and `ticket.release()` in a `finally`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from app.errors import QueueFull, QueueTimeout, ServiceUnavailable

_RESERVED, _WAITING, _RUNNING, _RELEASED = "reserved", "waiting", "running", "released"


@dataclass(frozen=True)
class AdmissionStats:
    running: int
    waiting: int
    in_system: int
    tokens_in_use: int
    token_budget: int
    peak_waiting: int
    refused_queue_full: int
    refused_queue_timeout: int


class Ticket:
    __slots__ = ("_admission", "state", "tokens", "started", "_future")

    def __init__(self, admission: Admission):
        self._admission = admission
        self.state = _RESERVED
        self.tokens = 0
        self.started = 0.0
        self._future: asyncio.Future[None] | None = None

    async def admit(self, tokens: int, timeout_s: float) -> None:
        await self._admission._admit(self, tokens, timeout_s)

    def release(self) -> None:
        self._admission._release(self)


class Admission:
    def __init__(
        self,
        max_running: int,
        max_queued: int,
        token_budget: int,
        queue_timeout_s: float,
        refusal: type[QueueFull] = QueueFull,
    ):
        self.max_running = max_running
        self.max_queued = max_queued
        self.token_budget = token_budget
        self.queue_timeout_s = queue_timeout_s
        self._refusal = refusal
        self._running = 0
        self._tokens_in_use = 0
        self._in_system = 0
        self._waiting: deque[Ticket] = deque()
        self._peak_waiting = 0
        self._refused_full = 0
        self._refused_timeout = 0
        self._mean_run_s = 1.0  # moving average of time in the engine, for Retry-After
        self._closed_reason: str | None = None

    def retry_after_s(self) -> float:
        """A fair guess at when a slot frees up: the queue ahead, served max_running at a time."""
        rounds = (len(self._waiting) + 1) / self.max_running
        return min(60.0, max(1.0, self._mean_run_s * rounds))

    def reserve(self) -> Ticket:
        self.refuse_if_full()
        self._in_system += 1
        return Ticket(self)

    def refuse_if_full(self) -> None:
        """Raises the refusal `reserve` would, without reserving anything: for work done before a slot is
        taken (tokenizing), so that a full replica still refuses before that work."""
        if self._closed_reason:
            raise ServiceUnavailable(self._closed_reason, retry_after_s=5)
        if self._in_system >= self.max_running + self.max_queued:
            self._refused_full += 1
            raise self._refusal(
                f"Server is at capacity ({self.max_running} running, {self.max_queued} queued); "
                "retry after the Retry-After delay, with backoff",
                retry_after_s=self.retry_after_s(),
            )

    def _fits(self, tokens: int) -> bool:
        if self._running >= self.max_running:
            return False
        return self._running == 0 or self._tokens_in_use + tokens <= self.token_budget

    def _start(self, ticket: Ticket) -> None:
        ticket.state = _RUNNING
        ticket.started = time.monotonic()
        self._running += 1
        self._tokens_in_use += ticket.tokens

    async def _admit(self, ticket: Ticket, tokens: int, timeout_s: float) -> None:
        assert ticket.state == _RESERVED, ticket.state
        ticket.tokens = tokens
        if not self._waiting and self._fits(tokens):
            self._start(ticket)
            return
        ticket.state = _WAITING
        ticket._future = asyncio.get_running_loop().create_future()
        self._waiting.append(ticket)
        self._peak_waiting = max(self._peak_waiting, len(self._waiting))
        try:
            await asyncio.wait_for(asyncio.shield(ticket._future), timeout=min(timeout_s, self.queue_timeout_s))
        except TimeoutError:
            if ticket.state == _RUNNING:  # admitted in the same instant the wait ran out
                return
            self._refused_timeout += 1
            raise QueueTimeout(
                f"Request waited {min(timeout_s, self.queue_timeout_s):.0f} s in the queue without a free slot; "
                "retry later",
                retry_after_s=self.retry_after_s(),
            ) from None

    def _release(self, ticket: Ticket) -> None:
        if ticket.state == _RELEASED:
            return
        if ticket.state == _RUNNING:
            self._running -= 1
            self._tokens_in_use -= ticket.tokens
            self._mean_run_s = 0.9 * self._mean_run_s + 0.1 * (time.monotonic() - ticket.started)
        elif ticket.state == _WAITING:
            self._waiting.remove(ticket)
        ticket.state = _RELEASED
        self._in_system -= 1
        self._pump()

    def _pump(self) -> None:
        while self._waiting and self._fits(self._waiting[0].tokens):
            ticket = self._waiting.popleft()
            self._start(ticket)
            if ticket._future is not None and not ticket._future.done():
                ticket._future.set_result(None)

    def close(self, reason: str) -> None:
        """Refuse new requests from now on (draining); those already in keep their places."""
        self._closed_reason = reason

    def stats(self) -> AdmissionStats:
        return AdmissionStats(
            running=self._running,
            waiting=len(self._waiting),
            in_system=self._in_system,
            tokens_in_use=self._tokens_in_use,
            token_budget=self.token_budget,
            peak_waiting=self._peak_waiting,
            refused_queue_full=self._refused_full,
            refused_queue_timeout=self._refused_timeout,
        )

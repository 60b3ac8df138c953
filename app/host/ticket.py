"""Ticket: one request's place in a replica's admission (app/host/admission.py), from `reserve` to `release`."""

from __future__ import annotations

import asyncio
from typing import Protocol

from app.host.pace import Work
from app.host.time_refusals import NO_TARGETS, Targets
from app.tenancy import Tenant

RESERVED, WAITING, RUNNING, RELEASED, EVICTED = "reserved", "waiting", "running", "released", "evicted"
ASIDE = "aside"  # out of the engine and of the count of places while its client does not read (host/pauses.py)


class Ticket:
    __slots__ = (
        "_admission", "state", "tokens", "prompt_tokens", "max_steps", "steps", "started", "last_output",
        "backlog", "batch", "predicted_first_s", "asked_at", "targets", "queued_at", "_future", "tenant",
        "pausable", "yield_asked", "paused", "resuming", "pauses",
    )

    def __init__(self, admission: Desk, tenant: Tenant):
        self._admission = admission
        self.tenant = tenant
        self.state = RESERVED
        self.tokens = self.prompt_tokens = self.max_steps = self.steps = 0
        self.started = self.last_output = 0.0
        self.backlog = self.batch = 0  # prefill backlog (own prompt included) and batch at its start
        self.predicted_first_s = 0.0  # the model's prediction at admission (0: none), and when it was made
        self.asked_at = 0.0
        self.targets = Targets()
        self.queued_at = 0.0  # when it joined the queue (its targets count from just before)
        self._future: asyncio.Future[None] | None = None
        self.pausable = False  # its host can pause it and resume it in place (app/host/pauses.py)
        self.yield_asked = False  # running: asked to give its slot to another tenant's request (host/preemption.py)
        self.paused = False  # waiting again after a pause, its client mid-stream: never refused from the queue
        self.resuming = False  # started again after a pause: its next output is no first token to learn from
        self.pauses = 0  # times it stepped out of the engine (for its log line)

    async def admit(self, tokens: int, timeout_s: float, targets: Targets = NO_TARGETS, prompt_tokens: int = 0,
                    max_steps: int = 0) -> None:
        """Waits for a slot for `tokens` (prompt + n * max_tokens) of the budget. With `targets`, the
        request (`prompt_tokens`, at most `max_steps` decode steps: its max_tokens) is refused at once with
        `OverTimeTarget` when the prediction misses them. `QueueTimeout` when the wait runs out."""
        await self._admission._admit(self, tokens, timeout_s, targets, prompt_tokens, max_steps)

    def produced(self, steps: int) -> None:
        """The engine's next output for this request: `steps` more tokens of each choice."""
        self._admission._produced(self, steps)

    @property
    def choices(self) -> int:
        """n: how many answers its budget holds `max_steps` tokens for (0 for an embedding, or not said)."""
        return (self.tokens - self.prompt_tokens) // self.max_steps if self.max_steps else 0

    def work(self, now: float, prefill_after: bool = False) -> Work:
        return Work(prompt_tokens=self.prompt_tokens, max_tokens=self.max_steps, generated=self.steps,
                    started_s_ago=now - self.started if self.state == RUNNING else 0.0,
                    first_output=self.last_output > 0, prefill_after=prefill_after, choices=max(1, self.choices))

    async def wait(self, timeout_s: float) -> bool:
        """Waits in the queue until it runs (True) or `timeout_s` runs out (False)."""
        if self.state == RUNNING:  # started before it could wait
            return True
        self._future = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._future), timeout=timeout_s)
        except TimeoutError:
            return self.state == RUNNING  # admitted in the same instant the wait ran out
        return True

    def wake(self, error: Exception | None = None) -> None:
        """Ends its wait in the queue: it runs, or with `error` it is refused."""
        if self._future is not None and not self._future.done():
            if error is None:
                self._future.set_result(None)
            else:
                self._future.set_exception(error)

    def step_aside(self) -> None:
        """Gives the slot back, and its place in the count of places (not its tenant's share), until it `pause`s to
        have one again."""
        self._admission._step_aside(self)

    async def pause(self, timeout_s: float) -> None:
        """Gives the slot back (if it has one) and waits, at the head of its tenant's queue, to have one again;
        `RequestTimeout` when `timeout_s` runs out first."""
        await self._admission._pause(self, timeout_s)

    def release(self, completed: bool = False) -> None:
        """Gives the slot back. `completed`: it ran to its end, so its length teaches the pace how much of
        `max_tokens` requests generate; a request cut short (hang-up, timeout, error) would teach it too
        little, and queued starts would then be predicted early (docs/overload.md)."""
        self._admission._release(self, completed)


class Desk(Protocol):
    """What a ticket asks of the admission that issued it."""

    async def _admit(self, ticket: Ticket, tokens: int, timeout_s: float, targets: Targets, prompt_tokens: int,
                     max_steps: int) -> None: ...

    def _produced(self, ticket: Ticket, steps: int) -> None: ...

    async def _pause(self, ticket: Ticket, timeout_s: float) -> None: ...

    def _step_aside(self, ticket: Ticket) -> None: ...

    def _release(self, ticket: Ticket, completed: bool = False) -> None: ...
